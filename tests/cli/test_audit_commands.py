"""`trustfabric audit export | verify | public-key`: real data directory, key store and database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from audit import Actor, record
from cli.main import app
from tests.cli.conftest import run_cli
from workflows.context import AppContext
from workflows.settings import Settings


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("audit-cli")
    env = {"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_CONFIG": str(base / "none.json"), "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["init", "--trust-domain", "example.org"], env=env)
    assert result.exit_code == 0, result.output
    ctx = AppContext.open(Settings.from_env(env))
    try:
        with ctx.db.session() as s:
            for i in range(25):
                record(
                    s,
                    actor=Actor("op", "admin"),
                    action="grant.approve",
                    object_type="grant",
                    object_id=f"g-{i}",
                    tenant=("acme", "globex")[i % 2],
                )
    finally:
        ctx.close()
    return env


def _run(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def test_export_then_verify_offline(home: dict[str, str], tmp_path: Path) -> None:
    code, pem = _run(home, "audit", "public-key")
    assert code == 0 and pem.startswith("-----BEGIN PUBLIC KEY-----")
    key = tmp_path / "audit.pem"
    key.write_text(pem)
    for fmt in ("jsonl", "csv", "ocsf"):
        out = tmp_path / f"export.{fmt}"
        code, text = _run(home, "audit", "export", "--out", str(out), "--format", fmt, "--tenant", "acme", "--json")
        assert code == 0, text
        summary = json.loads(text)
        assert summary["events"] >= 13 and not (tmp_path / f"export.{fmt}.part").exists()
        # offline: no TRUSTFABRIC_HOME at all, only the file and the key
        code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key))
        assert code == 0 and text.startswith("OK:"), text
        assert "selection: tenant acme" in text, text  # the auditor sees what the export claims to hold


def test_verify_names_the_first_bad_event_in_one_line(home: dict[str, str], tmp_path: Path) -> None:
    key = tmp_path / "audit.pem"
    key.write_text(_run(home, "audit", "public-key")[1])
    out = tmp_path / "export.jsonl"
    assert _run(home, "audit", "export", "--out", str(out))[0] == 0
    lines = out.read_bytes().splitlines(keepends=True)
    lines[8] = lines[8].replace(b'"id":"g-', b'"id":"G-')
    out.write_bytes(b"".join(lines))
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key))
    assert code == 1
    assert text.strip().count("\n") == 0 and "event 7" in text and "modified" in text, text
    code, text = _run({}, "audit", "verify", str(out), "--public-key", str(key), "--json")
    assert code == 1 and json.loads(text)["index"] == 7 and json.loads(text)["kind"] == "modified"
    code, text = _run({}, "audit", "verify", str(tmp_path / "missing"), "--public-key", str(key))
    assert code == 1 and "Traceback" not in text and text.strip().count("\n") == 0


def test_note_form_of_the_public_key(home: dict[str, str]) -> None:
    code, text = _run(home, "audit", "public-key", "--note")
    name, keyhash, _blob = text.strip().split("+", 2)
    assert code == 0 and name == "example.org/audit" and len(keyhash) == 8


def test_usage_errors(home: dict[str, str], tmp_path: Path) -> None:
    code, _text = _run(home, "audit", "export", "--out", str(tmp_path / "x"), "--format", "xml")
    assert code == 2 and not (tmp_path / "x").exists()


def test_bad_input_fails_in_one_line_without_traceback(home: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "never"
    for args in (["--since", "yesterday"], ["--tenant", "Not_A_Slug"], ["--since", "2026-01-01T00:00:00"]):
        proc = run_cli(["audit", "export", "--out", str(out), *args], home)  # main(): the binary's error path
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
        assert not out.exists()
