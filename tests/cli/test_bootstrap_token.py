"""Should fix (issue 13): the bootstrap admin token is shown on a terminal only. When stdout is not a terminal
(a service manager's log, a pipe) it goes to a 0600 file in the data directory and stdout names the file;
`trustfabric token recover` makes a new one on the host and revokes the earlier ones."""

from __future__ import annotations

import json
import os
import pty
import stat
import subprocess
import sys
from pathlib import Path

from sqlmodel import col, select

from audit.models import AuditEvent
from pki.tokens.models import ApiToken
from pki.tokens.service import opaque_token
from tests.cli.conftest import run_cli
from workflows.context import AppContext
from workflows.settings import Settings

BIN = str(Path(sys.executable).parent / "trustfabric")


def _env(home: Path) -> dict[str, str]:
    return {"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_MODE": "development"}


def test_without_a_terminal_the_token_goes_to_a_private_file(tmp_path: Path) -> None:
    """Printed to any stdout (and so into service logs) on the code before the fix."""
    home = tmp_path / "home"
    r = run_cli(["init", "--trust-domain", "example.org"], _env(home))
    assert r.returncode == 0, r.stderr
    path = home / "bootstrap-admin-token"
    assert "tfo_" not in r.stdout and f"admin API token written to {path} (mode 0600" in r.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    ctx = AppContext.open(Settings.from_env(_env(home)))
    try:
        with ctx.db.read_session() as s:
            row = opaque_token(s, token, ctx.clock)
        assert row.role == "admin" and row.expires_at is not None  # and it expires (a day by default)
    finally:
        ctx.close()
    again = run_cli(["init", "--trust-domain", "example.org", "--json"], _env(home))
    assert json.loads(again.stdout)["admin_token"] is None  # made once


def test_on_a_terminal_the_token_is_shown_and_no_file_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    proc = subprocess.Popen([BIN, "init", "--trust-domain", "example.org"], env={**env, **_env(home)},
                            stdout=secondary, stderr=subprocess.PIPE)
    os.close(secondary)
    out = b""
    try:
        while chunk := os.read(primary, 4096):
            out += chunk
    except OSError:  # the terminal closes with the process
        pass
    finally:
        os.close(primary)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    text = out.decode()
    assert "admin API token (shown once" in text and "tfo_" in text
    assert not (home / "bootstrap-admin-token").exists()


def test_token_recover_replaces_the_bootstrap_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run_cli(["init", "--trust-domain", "example.org"], _env(home)).returncode == 0
    first = (home / "bootstrap-admin-token").read_text().strip()
    r = run_cli(["token", "recover", "--json"], _env(home))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["admin_token"] is None and out["admin_token_file"] == str(home / "bootstrap-admin-token")
    second = (home / "bootstrap-admin-token").read_text().strip()
    assert second != first and len(out["revoked"]) == 1
    ctx = AppContext.open(Settings.from_env(_env(home)))
    try:
        with ctx.db.read_session() as s:
            assert opaque_token(s, second, ctx.clock).role == "admin"
            old = s.exec(select(ApiToken).where(ApiToken.id == out["revoked"][0])).one()
            assert old.revoked_at is not None
            actions = [e.action for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()][-2:]
        assert actions == ["token.revoke", "token.create"]
    finally:
        ctx.close()
