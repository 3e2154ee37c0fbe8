"""Every mutating PKI / audit CLI command writes exactly its audit events; a refused one writes none.

(The API side is walked by tests/audit/test_every_mutation_audited.py; this is the CLI side, through the
real `init`, data directory, key store and database.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sqlmodel import col, select
from typer.testing import CliRunner

from audit.models import AuditEvent
from cli.main import app
from workflows.context import AppContext
from workflows.settings import Settings


def _actions_after(step: Callable[[], int]) -> tuple[int, list[str]]:
    ctx = AppContext.open(Settings.from_env())
    try:
        with ctx.db.read_session() as s:
            last = s.exec(select(AuditEvent.seq).order_by(col(AuditEvent.seq).desc())).first()
        code = step()
        with ctx.db.read_session() as s:
            start = -1 if last is None else last
            rows = s.exec(select(AuditEvent).where(col(AuditEvent.seq) > start).order_by(col(AuditEvent.seq))).all()
        return code, [r.action for r in rows]
    finally:
        ctx.close()


def _run(*args: str) -> Callable[[], int]:
    def step() -> int:
        return CliRunner().invoke(app, list(args)).exit_code

    return step


def test_each_mutating_cli_command_writes_exactly_its_events(home: Path) -> None:
    csr = str(home / "req.pem")
    wl = ["--tenant", "acme", "--group", "web", "--workload", "web-1"]
    refused = [
        ["svid", "issue", "--csr", csr, "--tenant", "acme", "--group", "web", "--workload", "ghost"],
        ["svid", "issue", "--csr", str(home / "missing.pem"), *wl],
        ["svid", "issue", "--csr", csr, *wl, "--ttl", "999999"],
        ["svid", "jwt", *wl, "--audience", ""],
        ["svid", "revoke", "--serial", "abcdef", "--reason", "x"],
        ["svid", "revoke", "--tenant", "acme", "--reason", " "],
        ["node", "token", "create", "--node", "Bad_Name"],
        ["node", "token", "create", "--node", "gpu-01", "--ttl", "0"],
        ["audit", "export", "--out", str(home / "x.jsonl"), "--tenant", "Not_A_Slug"],
        ["audit", "export", "--out", str(home / "x.jsonl"), "--since", "2026-01-01T00:00:00"],
    ]
    for args in refused:
        code, written = _actions_after(_run(*args))
        assert code != 0 and written == [], (args, code, written)

    code, written = _actions_after(_run("svid", "issue", "--csr", csr, *wl, "--out", str(home / "svid.pem")))
    assert (code, written) == (0, ["svid.issue"])
    serial = CliRunner().invoke(app, ["svid", "issue", "--csr", csr, *wl, "--json"]).stdout
    serial = json.loads(serial)["serial"]
    assert _actions_after(_run("svid", "jwt", *wl, "--audience", "a")) == (0, ["svid.jwt.issue"])
    assert _actions_after(_run("svid", "revoke", "--serial", serial, "--reason", "test")) == (0, ["svid.revoke"])
    assert _actions_after(_run("svid", "revoke", "--serial", serial, "--reason", "again"))[1] == []
    assert _actions_after(_run("node", "token", "create", "--node", "gpu-01")) == (0, ["node.token.create"])
    assert _actions_after(_run("ca", "rotate")) == (0, [])  # nothing due
    assert _actions_after(_run("ca", "rotate", "--force")) == (0, ["ca.prepare", "ca.activate"])
    assert _actions_after(_run("audit", "export", "--out", str(home / "e.jsonl"))) == (0, ["audit.export"])
    ctx = AppContext.open(Settings.from_env())
    try:
        with ctx.db.read_session() as s:
            last = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc())).first()
    finally:
        ctx.close()
    assert last is not None and last.actor_kind == "admin" and last.actor_id.startswith("cli:")  # who exported
    assert _actions_after(_run("svid", "revoke", "--tenant", "acme", "--reason", "incident")) == (
        0, ["identity.revoke"])
    # init a second time changes nothing, and says so
    code, written = _actions_after(_run("init", "--trust-domain", "example.org"))
    assert (code, written) == (0, [])
    code, written = _actions_after(_run("init", "--trust-domain", "other.org"))
    assert code != 0 and written == []
