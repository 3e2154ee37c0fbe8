"""Issue 13, item 5: user-supplied Rego runs in a limited process (policy/sandbox.py). A job over its CPU
budget or its memory limit ends in a 422 naming the budget; a compile error and a report come back intact;
the calling process is never the one evaluating."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy import authoring
from policy.errors import PolicyBudgetExceeded, PolicyCompileError
from policy.sandbox import Limits, run_limited

SPIN = {"spin_test.rego": "package spin_test\n\ntest_spin if {\n"  # 4e8 steps, little memory
        "\tcount([1 | some i in numbers.range(1, 20000); some j in numbers.range(1, 20000); i == j]) > 0\n}\n"}
HOG = {"hog_test.rego": "package hog_test\n\ntest_hog if {\n"
       "\tcount([[i, i] | some i in numbers.range(1, 400000000)]) > 0\n}\n"}
FAST = {"ok.rego": "package ok\n\nx := 1\n",
        "ok_test.rego": "package ok_test\n\nimport data.ok\n\ntest_x if ok.x == 1\n"}
LIMITS = Limits(cpu_seconds=1, memory_mb=128, workers=2)


def test_a_job_over_its_cpu_budget_is_ended_and_named() -> None:
    start = time.monotonic()
    with pytest.raises(PolicyBudgetExceeded, match=r"^policy tests exceeded the 1 s CPU budget$") as info:
        run_limited(authoring.test, SPIN, limits=LIMITS, what="policy tests")
    assert info.value.http_status == 422
    assert time.monotonic() - start < 8  # the whole range would take minutes


def test_a_job_over_its_memory_limit_is_ended_and_named() -> None:
    with pytest.raises(PolicyBudgetExceeded, match=r"^policy tests exceeded the 128 MiB memory limit$"):
        run_limited(authoring.test, HOG, limits=Limits(cpu_seconds=20, memory_mb=128), what="policy tests")


def test_answers_and_errors_come_back_intact() -> None:
    report = run_limited(authoring.test, FAST, limits=LIMITS, what="policy tests")
    assert report.passed and [r.name for r in report.results] == ["ok_test.test_x"]
    with pytest.raises(PolicyCompileError) as info:
        run_limited(authoring.validate, {"a.rego": "package a\n\nx := {\n"}, limits=LIMITS, what="validation")
    assert info.value.issues and info.value.issues[0].file == "a.rego"
    assert run_limited(os.getpid, limits=LIMITS, what="x") != os.getpid()  # another process did the work


MAIN = """import os, sys
sys.path.insert(0, {root!r})
if __name__ == "__mp_main__":  # multiprocessing runs the main script again, under this name
    with open({ran!r}, "a") as out:
        out.write(f"{{os.getpid()}}\\n")
from policy.sandbox import Limits, run_limited

def here():
    return "defined in the main script"

if __name__ == "__main__":
    limits = Limits(cpu_seconds=5, workers=1)
    print(run_limited(here, limits=limits, what="x"), len({{run_limited(os.getpid, limits=limits, what="x")
                                                           for _ in range(3)}}))
"""


def test_jobs_do_not_run_the_main_script_again(tmp_path: Path) -> None:
    """Item 5 (the sandbox adds under 50 ms to a job): every job re-ran the parent's main script before it
    started; in the server that is the `trustfabric` entry point, which imports the whole CLI and API, ~100 ms
    a job (multiprocessing's "__main__" preload never worked before CPython 3.13). The fork server now runs it
    once, and a job still finds what it defines."""
    ran = tmp_path / "ran"
    script = tmp_path / "main.py"
    script.write_text(MAIN.format(root=str(Path(__file__).resolve().parents[2]), ran=str(ran)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["defined", "in", "the", "main", "script", "3"]  # four jobs, three processes
    assert len(ran.read_text().split()) == 1  # in the fork server alone, not in each of the four jobs


def test_a_version_with_no_tests_has_not_passed() -> None:
    """Should fix: a version with zero tests was reported "passed" (all() of nothing is true)."""
    report = authoring.test({"ok.rego": "package ok\n\nx := 1\n"})
    assert report.results == [] and report.passed is False
