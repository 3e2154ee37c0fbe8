"""`trustfabric grant request|list|show|revoke|approve|reject`, through the API."""

from __future__ import annotations

from typing import Any

import typer

from cli.output import JsonOpt, err_console
from cli.remote.common import CaOpt, ServerOpt, client, show
from core.clock import parse_ttl
from core.vocabulary import GRANT_STATES, one_of

COLUMNS = ("id", "state", "src", "dst", "proto", "ports", "expires", "waiting for / reasons")


def _row(g: dict[str, Any]) -> list[Any]:
    why = ", ".join(g["pending_approvers"]) if g["state"] == "pending" else "; ".join(g["reasons"][-2:])
    return [g["id"], g["state"], f"{g['src_tenant']}/{g['src_group']}", f"{g['dst_tenant']}/{g['dst_group']}",
            g["proto"], ",".join(str(p) for p in g["ports"]), g.get("expires_at") or "", why]


def _show_grant(g: dict[str, Any], json_out: bool) -> None:
    if json_out:
        show(g, True)
        return
    print(f"grant {g['id']}: {g['state']}")
    print(f"  {g['src_tenant']}/{g['src_group']} -> {g['dst_tenant']}/{g['dst_group']} "
          f"{g['proto']}/{','.join(str(p) for p in g['ports'])} for {g['ttl_seconds']}s")
    if g["state"] == "pending":
        print(f"  waiting for: {', '.join(g['pending_approvers'])} (until {g['pending_until']})")
    if g.get("expires_at"):
        print(f"  expires at: {g['expires_at']}")
    for reason in g["reasons"]:
        print(f"  reason: {reason}")


def register(app: typer.Typer) -> None:
    grant = typer.Typer(help="Access grants: request, list, approve, reject, revoke.", no_args_is_help=True)
    app.add_typer(grant, name="grant")

    @grant.command("request")
    def request_cmd(
        src_group: str = typer.Option(..., "--src-group", help="your group that needs access"),
        dst: str = typer.Option(..., "--dst", help="destination TENANT/GROUP"),
        port: list[int] = typer.Option(..., "--port", help="destination port (repeatable)"),
        proto: str = typer.Option("tcp", "--proto", help="tcp or udp"),
        ttl: str = typer.Option("24h", "--ttl", help="e.g. 1h, 24h, 7d"),
        justification: str = typer.Option("", "--justification", "-j"),
        src_tenant: str = typer.Option(None, "--src-tenant", help="platform principals only"),
        idempotency_key: str = typer.Option(None, "--idempotency-key", help="reuse to retry safely"),
        server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt,
    ) -> None:
        """Ask for flows to another tenant's group; prints the decision (exit 1 when denied)."""
        dst_tenant, sep, dst_group = dst.partition("/")
        if not sep or not dst_tenant or not dst_group:
            raise typer.BadParameter("--dst must be TENANT/GROUP")
        body = {"src_group": src_group, "dst_tenant": dst_tenant, "dst_group": dst_group, "proto": proto,
                "ports": port, "ttl_seconds": int(parse_ttl(ttl).total_seconds()), "justification": justification}
        if src_tenant:
            body["src_tenant"] = src_tenant
        from cli.remote.client import new_idempotency_key

        g = client(server, cacert).post("/v1/grants", body, idempotency_key=idempotency_key or new_idempotency_key())
        _show_grant(g, json_out)
        if g["state"] == "denied":
            if json_out:
                err_console.print("error: grant request denied: " + "; ".join(g["reasons"]), markup=False)
            raise typer.Exit(1)

    @grant.command("list")
    def list_cmd(
        state: str = typer.Option(None, "--state", help=one_of(GRANT_STATES)),
        src_tenant: str = typer.Option(None, "--src-tenant"),
        dst_tenant: str = typer.Option(None, "--dst-tenant"),
        server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt,
    ) -> None:
        """Grants you can see (as a tenant: where you are source or destination)."""
        items = client(server, cacert).pages("/v1/grants", state=state, src_tenant=src_tenant, dst_tenant=dst_tenant)
        show(items, json_out, title="grants", columns=COLUMNS, rows=[_row(g) for g in items])

    @grant.command("show")
    def show_cmd(grant_id: str, server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """One grant, with its state, approvers and reasons."""
        _show_grant(client(server, cacert).get(f"/v1/grants/{grant_id}"), json_out)

    @grant.command("approve")
    def approve_cmd(grant_id: str, comment: str = typer.Option("", "--comment"),
                    server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Approve as a named approver."""
        _show_grant(client(server, cacert).post(f"/v1/grants/{grant_id}/approve", {"comment": comment}), json_out)

    @grant.command("reject")
    def reject_cmd(grant_id: str, reason: str = typer.Option(..., "--reason"),
                   server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Reject a pending grant as a named approver."""
        _show_grant(client(server, cacert).post(f"/v1/grants/{grant_id}/reject", {"reason": reason}), json_out)

    @grant.command("revoke")
    def revoke_cmd(grant_id: str, reason: str = typer.Option(..., "--reason"),
                   server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Withdraw a pending or active grant."""
        _show_grant(client(server, cacert).post(f"/v1/grants/{grant_id}/revoke", {"reason": reason}), json_out)

