"""The local `trustfabric enforcer` commands that change what devices get (compile's holds, apply, rollback) record
the operator who ran them, as every other local command does (`token create`, `ca rotate`: cli:<user>), not the
server's reconciler ("enforcer"): an auditor reads who pushed a device's rule set from the log."""

from __future__ import annotations

import getpass

from sqlmodel import col, select

from audit.models import AuditEvent
from tests.cli.conftest import Cli
from tests.enforcer.helpers import SMALL
from workflows.context import AppContext
from workflows.settings import Settings


def _events(cli: Cli) -> list[AuditEvent]:
    ctx = AppContext.open(Settings.from_env(cli.env))
    try:
        with ctx.db.read_session() as s:
            return list(s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all())
    finally:
        ctx.close()


def test_local_enforcer_changes_name_the_operator_as_other_local_commands_do(cli: Cli) -> None:
    start = _events(cli)[-1].seq  # after init's own (system) events
    admin = cli.token("--role", "admin", "--ttl", "1h")  # a local command's event: the rule the others follow
    assert cli.run("fabric", "import", str(SMALL), token=admin).returncode == 0
    held = cli.run("enforcer", "compile", TRUSTFABRIC_ENFORCER_MODE="manual")  # manual mode: every device held
    assert held.returncode == 0 and "held nic:gpu1" in held.stdout, (held.stdout, held.stderr)
    assert cli.json("enforcer", "apply")["published"]["nic:gpu1"] == 1
    acme = cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")
    globex = cli.token("--role", "tenant-admin", "--tenant", "globex", "--ttl", "1h")
    g = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/api", "--port", "8443", token=acme)
    assert cli.json("grant", "approve", g["id"], token=globex)["state"] == "active"
    assert cli.json("enforcer", "apply", "--device", "nic:gpu1")["published"] == {"nic:gpu1": 2}
    assert cli.json("enforcer", "rollback", "--device", "nic:gpu1", "--to", "1")["version"] == 3
    assert cli.run("ca", "rotate", "--force").returncode == 0
    events = [e for e in _events(cli) if e.seq > start]
    operator = (f"cli:{getpass.getuser()}", "admin")
    local = [e for e in events if e.action in ("token.create", "ca.prepare", "ca.activate")]
    assert local and {(e.actor_id, e.actor_kind) for e in local} == {operator}
    enforcer = [e for e in events if e.action.startswith("enforcer.")]
    assert {"enforcer.hold", "enforcer.publish", "enforcer.rollback"} <= {e.action for e in enforcer}
    assert {(e.actor_id, e.actor_kind) for e in enforcer} == {operator}, {(e.action, e.actor_id) for e in enforcer}
