"""A file to write (`--out`) in a folder that does not exist is the command line's mistake: refused while the
arguments are parsed (exit 2, one line naming --out), before any work. `svid issue --out` used to issue the SVID
(and audit it) and then fail to write it; `audit export --out` named its temporary `.part` file in a Python
exception (`FileNotFoundError: ...`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.cli.conftest import run_cli


def _env(base: Path) -> dict[str, str | None]:
    return {"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_CONFIG": str(base / "none.json"),
            "TRUSTFABRIC_MODE": "development", "COLUMNS": "200"}


def _events(base: Path) -> int:
    db = sqlite3.connect(base / "home" / "trustfabric.db")
    try:
        return int(db.execute("SELECT count(*) FROM audit_events").fetchone()[0])
    finally:
        db.close()


@pytest.mark.parametrize("command", [
    ["svid", "issue", "--csr", "{base}/req.pem", "--tenant", "acme", "--group", "web", "--workload", "web-1"],
    ["audit", "export", "--format", "jsonl"],
], ids=["svid issue", "audit export"])
def test_out_in_a_missing_folder_is_usage_and_nothing_happens(home: Path, command: list[str]) -> None:
    before = _events(home)
    args = [a.format(base=home) for a in command]
    r = run_cli([*args, "--out", str(home / "missing" / "out.pem")], _env(home))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and "--out" in r.stderr and "missing" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Error:" not in r.stderr and ".part" not in r.stderr
    assert _events(home) == before  # nothing issued, exported or audited
    assert not (home / "missing").exists()


def test_out_in_an_existing_folder_still_writes(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = run_cli(["svid", "issue", "--csr", str(home / "req.pem"), "--tenant", "acme", "--group", "web",
                 "--workload", "web-1", "--out", str(home / "svid.pem")], _env(home))
    assert r.returncode == 0, r.stderr
    assert (home / "svid.pem").read_bytes().count(b"BEGIN CERTIFICATE") >= 2
    monkeypatch.chdir(home)
    r = run_cli(["audit", "export", "--out", "relative.jsonl"], _env(home))  # a bare name: the current folder
    assert r.returncode == 0, r.stderr
    assert (home / "relative.jsonl").stat().st_size > 0


@pytest.mark.parametrize("command", [
    ["svid", "issue", "--csr", "{base}/req.pem", "--tenant", "acme", "--group", "web", "--workload", "web-1"],
    ["audit", "export", "--format", "csv"],
], ids=["svid issue", "audit export"])
def test_out_dash_is_usage_not_a_file_named_dash(home: Path, command: list[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out -` means standard output to a Unix user; it wrote (and audited) a file named `-` in the current
    folder, and said so in passing. Refused while parsing, naming the option, nothing written or audited."""
    monkeypatch.chdir(home)
    before = _events(home)
    r = run_cli([*(a.format(base=home) for a in command), "--out", "-"], _env(home))
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "--out" in r.stderr, r.stderr
    assert "never standard output" in r.stderr, r.stderr
    assert not (home / "-").exists() and _events(home) == before
