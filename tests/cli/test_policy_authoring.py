"""What `opa` gives a policy author, through `trustfabric policy`: test with a summary line, --run and
--coverage; eval of any query on files or a stored version; upload that says when a stored version cannot
be activated."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from policy.shipped import REGO_DIR
from tests.cli.conftest import run_cli

LIB = "package lib\n\nimport rego.v1\n\ndouble(x) := 2 * x\n\nbig(x) if x > 100\n"
LIB_TEST = ("package lib_test\n\nimport data.lib\nimport rego.v1\n\n"
            "test_double if lib.double(2) == 4\n\ntest_double_zero if lib.double(0) == 0\n\n"
            "test_wrong if lib.double(1) == 3\n")


@pytest.fixture
def rego(tmp_path: Path) -> Path:
    d = tmp_path / "rego"
    d.mkdir()
    (d / "lib.rego").write_text(LIB)
    (d / "lib_test.rego").write_text(LIB_TEST)
    return d


def test_summary_line_failures_and_run(rego: Path) -> None:
    r = run_cli(["policy", "test", str(rego)], {"COLUMNS": "120"})
    assert r.returncode == 1
    assert "FAIL: 1/3" in r.stdout and "lib_test.test_wrong" in r.stdout  # the failure listed, with its error
    assert "test_double_zero" not in r.stdout  # passing tests only with --verbose
    assert r.stderr.startswith("error: 1 of 3 tests failed: lib_test.test_wrong")
    r = run_cli(["policy", "test", str(rego), "--run", "double"], {})
    assert r.returncode == 0 and r.stdout.strip().endswith("PASS: 2/2")
    r = run_cli(["policy", "test", str(rego), "--run", "double", "-v"], {"COLUMNS": "120"})
    assert "lib_test.test_double_zero" in r.stdout
    r = run_cli(["policy", "test", str(rego), "--run", "nothing-matches"], {})
    assert r.returncode == 1 and "no test matches" in r.stderr
    r = run_cli(["policy", "test", str(rego), "--run", "("], {})
    assert r.returncode == 2 and "regular expression" in r.stderr
    out = json.loads(run_cli(["policy", "test", str(rego), "--json"], {}).stdout)
    assert out["summary"] == "FAIL: 1/3" and out["failing"] == ["lib_test.test_wrong"]


def test_the_shipped_policies_pass_with_coverage() -> None:
    r = run_cli(["policy", "test", str(REGO_DIR), "--coverage"], {"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^PASS: (\d+)/\1$", r.stdout, re.MULTILINE)
    for module in ("flows.rego", "grants.rego", "api_authz.rego"):
        assert re.search(rf"{module}\s+\d+\.\d%", r.stdout), r.stdout
    assert "_test.rego" not in r.stdout.split("coverage")[-1]
    out = json.loads(run_cli(["policy", "test", str(REGO_DIR), "--coverage", "--json"], {}).stdout)
    files = {f["file"]: f for f in out["coverage"]["files"]}
    assert set(files) == {"flows.rego", "grants.rego", "api_authz.rego"}
    assert all(0 < f["percent"] <= 100 for f in files.values()) and 0 < out["coverage"]["percent"] <= 100


def test_coverage_counts_the_lines_the_tests_reach(rego: Path) -> None:
    out = json.loads(run_cli(["policy", "test", str(rego), "--run", "double", "--coverage", "--json"], {}).stdout)
    (lib,) = out["coverage"]["files"]
    assert lib["file"] == "lib.rego" and 5 in lib["covered"] and 7 in lib["not_covered"]  # big() never called
    assert lib["percent"] == 50.0


def test_eval_on_files(rego: Path, tmp_path: Path) -> None:
    (tmp_path / "input.json").write_text('{"n": 21}')
    (tmp_path / "data.yaml").write_text("limits:\n  max: 7\n")
    r = run_cli(["policy", "eval", "data.lib.double(input.n)", "--data", str(rego / "lib.rego"),
                 "--input", str(tmp_path / "input.json")], {})
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    r = run_cli(["policy", "eval", "data.limits.max", "-d", str(rego), "-d", str(tmp_path / "data.yaml"),
                 "--json"], {})
    assert json.loads(r.stdout)["result"][0]["expressions"][0]["value"] == 7
    r = run_cli(["policy", "eval", "x := [1, 2][_]", "-d", str(rego)], {})
    assert r.stdout.split() == ["x", "=", "1", "x", "=", "2"]
    r = run_cli(["policy", "eval", "data.lib.nope", "-d", str(rego)], {})
    assert r.returncode == 0 and r.stdout.strip() == "undefined"
    r = run_cli(["policy", "eval", "count(1)", "-d", str(rego)], {})
    assert r.returncode == 1 and "<query.rego>:1:" in r.stderr and r.stderr.count("\n") == 1
    for empty in ("", " # nothing"):  # was the parser's "expecting ...", exit 1: a wrong argument is usage
        r = run_cli(["policy", "eval", empty, "-d", str(rego)], {})
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "the query is empty" in r.stderr, r.stderr


def _local(home: Path) -> dict[str, str | None]:
    """`home` (tests/cli/conftest.py): a data directory made by init, the shipped policies active as version 1."""
    return {"TRUSTFABRIC_HOME": str(home / "home"), "TRUSTFABRIC_CONFIG": str(home / "none.json")}


def test_eval_against_a_stored_version(home: Path) -> None:
    env = _local(home)
    r = run_cli(["policy", "eval", "data.flows.decision", "--input", str(_flow(home))], env)
    assert r.returncode == 0, r.stderr
    decision = json.loads(r.stdout)
    assert decision["allow"] is False and decision["reasons"]
    r = run_cli(["policy", "eval", "data.tf.tenants.acme.groups.web.sensitivity", "--version", "1", "--json"], env)
    assert json.loads(r.stdout)["result"][0]["expressions"][0]["value"] == "normal", r.stdout
    r = run_cli(["policy", "eval", "1", "--version", "9"], env)
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_eval_on_a_stored_version_runs_in_the_policy_sandbox(home: Path) -> None:
    """Stored Rego and the live data are evaluated where the server evaluates them, within the policy job
    limits (TRUSTFABRIC_POLICY_JOB_*): a query spinning for minutes ends at the CPU budget, in one line."""
    spin = "count([1 | some i in numbers.range(1, 20000); some j in numbers.range(1, 20000); i == j])"
    r = run_cli(["policy", "eval", spin, "--version", "1"], {**_local(home), "TRUSTFABRIC_POLICY_JOB_CPU_SECONDS": "1"})
    assert r.returncode == 1 and r.stderr == "error: the query exceeded the 1 s CPU budget\n", r.stderr


def _flow(home: Path) -> Path:
    path = home / "flow.json"
    path.write_text(json.dumps({"src": {"tenant": "acme", "group": "web"}, "dst": {"tenant": "globex", "group": "api"},
                                "port": 443, "proto": "tcp"}))
    return path


def test_upload_with_failing_tests_is_stored_but_exits_1(home: Path, rego: Path) -> None:
    env = _local(home)
    shutil.copytree(REGO_DIR, rego, dirs_exist_ok=True)
    r = run_cli(["policy", "upload", str(rego)], env)
    assert r.returncode == 1
    assert "version 2 uploaded" in r.stdout and "TESTS FAIL: lib_test.test_wrong" in r.stdout
    assert "version 2 is stored but cannot be activated" in r.stderr and r.stderr.count("\n") == 1
    listed = json.loads(run_cli(["policy", "list", "--json"], env).stdout)
    assert [(v["number"], v["tests_passed"]) for v in listed] == [(1, True), (2, False)]
    r = run_cli(["policy", "activate", "2"], env)
    assert r.returncode == 1 and "tests failed" in r.stderr
    (rego / "lib_test.rego").write_text(LIB_TEST.replace("== 3", "== 2"))
    r = run_cli(["policy", "upload", str(rego)], env)
    assert r.returncode == 0 and "version 3 uploaded" in r.stdout and "tests pass" in r.stdout
    broken = rego / "broken.rego"
    broken.write_text("package broken\n\nimport rego.v1\n\nallow if undefined_fn(1)\n")
    r = run_cli(["policy", "upload", str(rego)], env)
    assert r.returncode == 1 and f"{broken}:5:10: undefined function undefined_fn" in r.stderr
    assert len(json.loads(run_cli(["policy", "list", "--json"], env).stdout)) == 3  # nothing stored


def test_upload_without_tests_says_so(home: Path, tmp_path: Path) -> None:
    """A version with no test_* rule is stored but cannot be activated; upload said `TESTS FAIL: ` (naming none)
    and `0 of 0 Rego tests fail`, and `policy list` showed `0 failing`: the reason is that there are none."""
    env = _local(home)
    bare = tmp_path / "bare"
    shutil.copytree(REGO_DIR, bare)
    for test in bare.glob("*_test.rego"):
        test.unlink()
    r = run_cli(["policy", "upload", str(bare)], env)
    assert r.returncode == 1
    assert "version 2 uploaded" in r.stdout and "NO TESTS" in r.stdout and "TESTS FAIL" not in r.stdout, r.stdout
    assert "cannot be activated: it carries no Rego tests" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "0 of 0" not in r.stderr
    table = run_cli(["policy", "list"], {**env, "COLUMNS": "200"})
    row = next(line for line in table.stdout.splitlines() if line.startswith("2 "))
    assert "no tests" in row and "0 failing" not in row, table.stdout
