"""`trustfabric ... | head`: when the reader of the output stops reading, the command ends as cat or grep do --
quietly (no error line, no traceback) and with exit 0 -- whichever way the output was being written (rich's
console, typer's help, click, the interpreter's flush at exit). The installed binary, as a shell runs it, its
stdout a pipe whose reading end is closed before it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from policy.shipped import REGO_DIR

BINARY = str(Path(sys.executable).with_name("trustfabric"))


def _into_a_closed_pipe(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = subprocess.Popen([BINARY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command (~0.3 s to start) writes anything
    err = process.stderr.read().decode()
    process.stderr.close()
    return process.wait(timeout=60), err


@pytest.mark.parametrize("args", [
    ("--help",),
    ("policy", "eval", "data", "--data", str(REGO_DIR)),
    ("policy", "eval", "data", "--data", str(REGO_DIR), "--json"),
], ids=["help", "table", "json"])
def test_a_reader_that_went_away_ends_the_command_quietly(args: tuple[str, ...]) -> None:
    code, err = _into_a_closed_pipe(*args)
    assert (code, err) == (0, "")


def test_an_error_is_still_an_error_with_its_line() -> None:
    code, err = _into_a_closed_pipe("policy", "eval", "data", "--data", "/nonexistent-dir")
    assert code == 2 and err.startswith("error:") and "Traceback" not in err, err


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A data directory (init's events, the shipped policies active), an export of its log with one event altered,
    and its audit public key."""
    base = tmp_path_factory.mktemp("pipe")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    env.update({"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_CONFIG": str(base / "none.json"),
                "TRUSTFABRIC_MODE": "development"})
    for args in (["init", "--trust-domain", "example.org"], ["audit", "export", "--out", str(base / "a.jsonl")]):
        done = subprocess.run([BINARY, *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    key = subprocess.run([BINARY, "audit", "public-key"], env=env, capture_output=True, timeout=60)
    (base / "k.pem").write_bytes(key.stdout)
    lines = (base / "a.jsonl").read_text().splitlines(keepends=True)
    assert '"origin":"init"' in lines[1]
    (base / "altered.jsonl").write_text("".join([lines[0], lines[1].replace('"origin":"init"', '"origin":"evil"'),
                                                 *lines[2:]]))
    return base, env


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_reader_that_went_away_does_not_turn_a_no_into_a_yes(data_dir: tuple[Path, dict[str, str]],
                                                               json_out: bool) -> None:
    """A verdict is the exit code: `audit verify altered.jsonl --json | head -c0` under pipefail, or `policy explain
    ... | grep -q x`, must not read exit 0 (verified, ALLOW) for FAILED or DENY because the reader stopped early.
    Both exited 0 (the JSON at the last flush, the table from rich's console mid-command)."""
    base, env = data_dir
    extra = ["--json"] if json_out else []
    code, err = _into_a_closed_pipe("audit", "verify", str(base / "altered.jsonl"), "--public-key",
                                    str(base / "k.pem"), *extra, env=env)
    assert code == 1 and "Traceback" not in err, (code, err)
    code, err = _into_a_closed_pipe("policy", "explain", "--src", "acme/web", "--dst", "globex/api", "--port", "443",
                                    *extra, env=env)
    assert (code, err) == (1, ""), (code, err)
    intact = _into_a_closed_pipe("audit", "verify", str(base / "a.jsonl"), "--public-key", str(base / "k.pem"),
                                 *extra, env=env)
    assert intact == (0, "")


def test_a_broken_pipe_that_is_not_our_output_is_an_error_with_its_line(home: Path) -> None:
    """Only our own output's reader going away is quiet: a file to write that is a pipe nobody reads (here `--out`
    names one) is a failed write, exit 1 with its line. It exited 1 with no word at all (click's EPIPE exit)."""
    from tests.cli.conftest import run_cli

    env: dict[str, str | None] = {"TRUSTFABRIC_HOME": str(home / "home"), "TRUSTFABRIC_CONFIG": str(home / "none.json"),
                                  "TRUSTFABRIC_MODE": "development", "COLUMNS": "200"}
    read, write = os.pipe()
    os.close(read)  # nobody will read it
    try:
        r = run_cli(["svid", "issue", "--csr", str(home / "req.pem"), "--tenant", "acme", "--group", "web",
                     "--workload", "web-1", "--out", f"/proc/self/fd/{write}"], env)
    finally:
        os.close(write)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Broken pipe" in r.stderr, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
