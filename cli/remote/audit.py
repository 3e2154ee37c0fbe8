"""`trustfabric audit events|show|checkpoint`, through the API: what an auditor or a tenant reads from
their own machine (a tenant sees only its own tenant's events). Exports and offline verification are in
cli/local/audit.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from audit.actor import qualified_id
from cli.audit_filters import ActionOpt, ActorOpt, ActorTenantOpt, SinceOpt, TenantOpt, UntilOpt, check_window
from cli.output import API, Col, View, command, emit, err_console, machine_output
from cli.remote.common import CaOpt, ServerOpt, client


def _actor(event: dict[str, Any]) -> str:
    """`alice@acme` for acme's alice, the id alone for an actor of no tenant."""
    return qualified_id(str(event["actor"]["id"]), event["actor"].get("tenant"))


EVENTS = View("audit events", (
    Col("seq", "seq", kind="id"), Col("time", "ts", kind="time"), Col("actor", _actor, drop=1),
    Col("tenant", "tenant", drop=2), Col("action", "action"),
    Col("object", lambda e: f"{e['object']['type']}:{e['object']['id']}"), Col("reason", "reason", drop=3),
))


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def register(audit: typer.Typer) -> None:
    @command(audit, "events", API)
    def events_cmd(
        tenant: str = TenantOpt, action: str = ActionOpt, actor: str = ActorOpt, actor_tenant: str = ActorTenantOpt,
        since: Any = SinceOpt, until: Any = UntilOpt,
        limit: int = typer.Option(100, "--limit", min=1, max=1000, help="events shown (oldest first)"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Audit events, oldest first (a tenant principal sees its own tenant's only)."""
        check_window(since, until)
        api = client(server, cacert)
        query = {"tenant": tenant, "action": action, "actor": actor, "actor_tenant": actor_tenant,
                 "since": _iso(since), "until": _iso(until)}
        page = api.get("/v1/audit/events", **query, limit=limit)
        emit(page["items"], EVENTS)
        # a full page may be all there is: one more event asked for tells "the log ends here" from "it goes on"
        cursor = page.get("next_cursor")
        if cursor and api.get("/v1/audit/events", **query, limit=1, cursor=cursor)["items"]:
            last = page["items"][-1]
            err_console.print(
                f"(more events follow seq {last['seq']}: narrow with --since {last['ts']}, --tenant or --action, "
                "raise --limit (up to 1000), or `trustfabric audit export` for all)",
                highlight=False, markup=False, soft_wrap=True)

    @command(audit, "show", API)
    def show_cmd(seq: int = typer.Argument(..., min=0, help="the event's sequence number"),
                 server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One audit event: who did what to which object, why, and its place in the hash chain."""
        emit(client(server, cacert).get(f"/v1/audit/events/{seq}"), EVENTS)

    @command(audit, "checkpoint", API)
    def checkpoint_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """The latest signed checkpoint note (keep it: later exports must extend it)."""
        cp = client(server, cacert).get("/v1/audit/checkpoint")
        if machine_output():
            emit(cp)
        else:
            print(cp["note"], end="" if cp["note"].endswith("\n") else "\n")
