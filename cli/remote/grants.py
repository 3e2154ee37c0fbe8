"""`trustfabric grant request|explain|list|show|approve|reject|revoke`, through the API. Grant ids may be given
as unique prefixes (cli/ids.py)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from audit.actor import requester_label
from cli.output import API, Col, View, add_group, answer_no, command, emit, err_console, machine_output
from cli.params import GRANT_ID, PORT_MAYBE_PROTO, PROTO, SLUG, TENANT_GROUP, TTL, choice, one_protocol
from cli.remote.common import CaOpt, ServerOpt, client
from core.vocabulary import GRANT_STATES

if TYPE_CHECKING:
    from cli.remote.client import Client

FULL_ID = re.compile(r"^g-[0-9a-f]{12}-[0-9a-f]{16}$")
APPROVAL_NEEDED = "approval-needed: "  # rego/grants.rego: the request's reason naming each approver it waits for


def _why(g: dict[str, Any]) -> str:
    if g["state"] == "pending":
        return "waiting for " + ", ".join(g["pending_approvers"])
    if g["state"] == "active" and g.get("approvals"):  # not the request's `approval-needed`: that was answered
        return "approved as " + "; ".join(f"{a.get('as')} by {a.get('by')}" for a in g["approvals"])
    # decided: what ended it (revoked:, rejected:, expired:), never the request's `approval-needed` beside it
    return "; ".join(([r for r in g["reasons"] if not r.startswith(APPROVAL_NEEDED)] or g["reasons"])[-2:])


GRANTS = View("grants", (
    Col("id", "id", kind="id", short=True), Col("state", "state"),
    Col("from", lambda g: f"{g['src_tenant']}/{g['src_group']}"),
    Col("to", lambda g: f"{g['dst_tenant']}/{g['dst_group']}"),
    Col("ports", lambda g: f"{g['proto']}/{','.join(str(p) for p in g['ports'])}"),
    Col("expires", "expires_at", kind="when", drop=2), Col("why", _why, drop=1),
))

GrantId = typer.Argument(..., parser=GRANT_ID, metavar=GRANT_ID.metavar,
                         help="a grant id, or a prefix naming exactly one")

# `grant request` and `grant explain` take the same options (one definition, so they cannot drift): a user
# swaps one verb for the other on the same line
SrcGroupOpt = typer.Option(..., "--src-group", parser=SLUG, metavar="GROUP", help="your group that needs access")
DstOpt = typer.Option(..., "--dst", parser=TENANT_GROUP, metavar=TENANT_GROUP.metavar, help="destination TENANT/GROUP")
# a port as the grant prints it (`udp/4791`) is taken back as it is; the protocol then must agree with --proto
PortOpt = typer.Option(..., "--port", parser=PORT_MAYBE_PROTO, metavar=PORT_MAYBE_PROTO.metavar,
                       help="destination port, e.g. 8443 or udp/4791 (repeatable)")
ProtoOpt = typer.Option(None, "--proto", parser=PROTO, metavar=PROTO.metavar,
                        help="default: the one --port names, else tcp")
TtlOpt = typer.Option("24h", "--ttl", parser=TTL, metavar="TTL", help="e.g. 1h, 24h, 7d")
JustificationOpt = typer.Option("", "--justification", "-j")
SrcTenantOpt = typer.Option(None, "--src-tenant", parser=SLUG, metavar="TENANT", help="platform principals only")

# the live answer's outcome (GET /v1/policy/explain-grant), for people
WOULD = {"approve": "would be approved", "pending": "would be pending", "deny": "would be denied",
         "undisclosed": "undisclosed until requested"}  # the API's outcome word, as the reason's code says it


def requester(g: dict[str, Any]) -> str:
    """`alice@acme`, or `alice (platform role)` (never `alice@platform`: that is tenant platform's alice); the id
    alone may be another tenant's principal's (API token subjects are free text)."""
    return requester_label(g["requested_by"], g.get("requester_tenant"))


def grant_id(api: Client, given: str) -> str:
    """The full id of the grant `given` names (itself, or a unique prefix among the grants you can see)."""
    from cli.ids import resolve_lazily

    return resolve_lazily(given, lambda g: bool(FULL_ID.match(g)),
                          lambda: [g["id"] for g in api.pages("/v1/grants")], "grant")


def approval_history(g: dict[str, Any]) -> list[str]:
    """A grant's approvals for people. Pending: who approved so far (the request's `approval-needed` reasons stay
    current, with `waiting for`). Decided: each approval the request needed as history -- needed at request,
    then who gave it and when, or that it was never given -- instead of the request's `approval-needed: X`, which
    beside `active` reads as still waiting."""
    from cli.humanize import local_time

    given = list(g.get("approvals") or [])

    def approved(a: dict[str, Any]) -> str:
        comment = f" ({a['comment']})" if a.get("comment") else ""
        return f"approved as {a.get('as')} by {a.get('by')} at {local_time(a.get('at'))}{comment}"

    if g["state"] == "pending":
        return [f"  {approved(a)}" for a in given]
    lines = []
    for reason in g["reasons"]:
        if not reason.startswith(APPROVAL_NEEDED):
            continue
        role = reason[len(APPROVAL_NEEDED):]
        match = next((a for a in given if a.get("as") == role), None)
        if match is not None:
            given.remove(match)
            lines.append(f"  approval needed at request: {role}; {approved(match)}")
        else:
            lines.append(f"  approval needed at request: {role}; never given")
    lines.extend(f"  {approved(a)}" for a in given)  # one the request did not name (none today): still shown
    return lines


def show_grant(g: dict[str, Any]) -> None:
    """One grant for people: who, what, its state and why; machines get the API's object."""
    if machine_output():
        emit(g)
        return
    from cli.humanize import duration, local_time, printable, when

    lines = [f"grant {g['id']}: {g['state']}",
             f"  {g['src_tenant']}/{g['src_group']} -> {g['dst_tenant']}/{g['dst_group']} "
             f"{g['proto']}/{','.join(str(p) for p in g['ports'])} for {duration(timedelta(seconds=g['ttl_seconds']))}",
             f"  requested by {requester(g)} at {local_time(g['created_at'])}"]
    if g.get("justification"):
        lines.append(f"  justification: {g['justification']}")
    if g["state"] == "pending":
        lines.append(f"  waiting for: {', '.join(g['pending_approvers'])} (until {when(g['pending_until'])})")
    lines.extend(approval_history(g))
    if g.get("expires_at") and g["state"] == "revoked":  # ended early: "in 1h 59m" would read as still open
        lines.append(f"  was to expire: {local_time(g['expires_at'])} (revoked before)")
    elif g.get("expires_at"):
        lines.append(f"  {'expired' if g['state'] == 'expired' else 'expires'}: {when(g['expires_at'])}")
    lines.extend(f"  reason: {reason}" for reason in g["reasons"]
                 if g["state"] == "pending" or not reason.startswith(APPROVAL_NEEDED))
    lines.extend(f"  note: {note}" for note in g.get("notes") or ())  # what the devices add (RoCEv2's mirror)
    for line in lines:
        print(printable(line))  # the justification, reasons and comments are other principals' text


def show_answer(a: dict[str, Any]) -> None:
    """The policy's answer to a grant request not made, in `show_grant`'s style; machines get the API's object."""
    if machine_output():
        emit(a)
        return
    from cli.humanize import duration, printable

    asked = a["input"]
    ttl = duration(timedelta(seconds=asked["ttl_seconds"]))
    lines = [f"{WOULD.get(a['outcome'], a['outcome'])}: {asked['src']['tenant']}/{asked['src']['group']} -> "
             f"{asked['dst']['tenant']}/{asked['dst']['group']} {asked['proto']}/"
             f"{','.join(str(p) for p in asked['ports'])} for {ttl} (nothing was requested)"]
    if a["outcome"] == "pending":
        lines.append(f"  would wait for: {', '.join(a['approvers'])}")
    lines.extend(f"  reason: {reason}" for reason in a["reasons"])
    lines.extend(f"  note: {note}" for note in a.get("notes") or ())  # what the devices would add (RoCEv2)
    for line in lines:
        print(printable(line))  # the justification, reasons and comments are other principals' text


def register(app: typer.Typer) -> None:
    grant = add_group(app, "grant", "Access grants: explain, request, list, show, approve, reject, revoke.", API)

    @command(grant, "request", API)
    def request_cmd(
        src_group: str = SrcGroupOpt, dst: Any = DstOpt, port: list[Any] = PortOpt, proto: str | None = ProtoOpt,
        ttl: timedelta = TtlOpt, justification: str = JustificationOpt, src_tenant: str = SrcTenantOpt,
        idempotency_key: str = typer.Option(None, "--idempotency-key", help="reuse to retry safely"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Ask for flows to another tenant's group; prints the decision (exit 1 when denied)."""
        from cli.remote.client import new_idempotency_key

        dst_tenant, dst_group = dst
        proto, ports = one_protocol(port, proto)
        body: dict[str, Any] = {
            "src_group": src_group, "dst_tenant": dst_tenant, "dst_group": dst_group, "proto": proto,
            "ports": ports, "ttl_seconds": int(ttl.total_seconds()), "justification": justification}
        if src_tenant:
            body["src_tenant"] = src_tenant
        g = client(server, cacert).post("/v1/grants", body, idempotency_key=idempotency_key or new_idempotency_key())
        show_grant(g)
        if g["state"] == "denied":
            if machine_output():
                err_console.print("error: grant request denied: " + "; ".join(g["reasons"]), markup=False)
            answer_no()

    @command(grant, "explain", API)
    def explain_cmd(
        src_group: str = SrcGroupOpt, dst: Any = DstOpt, port: list[Any] = PortOpt, proto: str | None = ProtoOpt,
        ttl: timedelta = TtlOpt,
        justification: str = typer.Option("", "--justification", "-j",
                                          help="accepted as `grant request` takes it; the policy does not read it"),
        src_tenant: str = SrcTenantOpt,
        idempotency_key: str = typer.Option(None, "--idempotency-key",
                                            help="accepted as `grant request` takes it; nothing is requested"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """What `grant request` with these options would get now: approved, pending (and whom it would wait for),
        denied (and why), or undisclosed until requested; nothing is requested or recorded (exit 1 when it would
        be denied)."""
        del justification, idempotency_key  # not part of the policy's input; taken so the verbs swap
        dst_tenant, dst_group = dst
        proto, ports = one_protocol(port, proto)
        a = client(server, cacert).get(
            "/v1/policy/explain-grant", src_group=src_group, dst_tenant=dst_tenant, dst_group=dst_group,
            proto=proto, ports=ports, ttl_seconds=int(ttl.total_seconds()), src_tenant=src_tenant)
        show_answer(a)
        if a["outcome"] == "deny":
            if machine_output():
                err_console.print("error: grant request would be denied: " + "; ".join(a["reasons"]), markup=False)
            answer_no()

    @command(grant, "list", API)
    def list_cmd(
        state: str = typer.Option(None, "--state", parser=choice(*GRANT_STATES), metavar="STATE",
                                  help="|".join(GRANT_STATES)),
        src_tenant: str = typer.Option(None, "--src-tenant", parser=SLUG, metavar="TENANT"),
        dst_tenant: str = typer.Option(None, "--dst-tenant", parser=SLUG, metavar="TENANT"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Grants you can see (as a tenant: where you are source or destination)."""
        emit(client(server, cacert).pages("/v1/grants", state=state, src_tenant=src_tenant, dst_tenant=dst_tenant),
             GRANTS)

    @command(grant, "show", API)
    def show_cmd(gid: str = GrantId, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One grant, with its state, approvers and reasons."""
        api = client(server, cacert)
        show_grant(api.get(f"/v1/grants/{grant_id(api, gid)}"))

    @command(grant, "approve", API)
    def approve_cmd(gid: str = GrantId, comment: str = typer.Option("", "--comment"),
                    server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Approve as a named approver."""
        api = client(server, cacert)
        show_grant(api.post(f"/v1/grants/{grant_id(api, gid)}/approve", {"comment": comment}))

    @command(grant, "reject", API)
    def reject_cmd(gid: str = GrantId, reason: str = typer.Option(..., "--reason"),
                   server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Reject a pending grant as a named approver."""
        api = client(server, cacert)
        show_grant(api.post(f"/v1/grants/{grant_id(api, gid)}/reject", {"reason": reason}))

    @command(grant, "revoke", API)
    def revoke_cmd(gid: str = GrantId, reason: str = typer.Option(..., "--reason"),
                   server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Withdraw a pending or active grant."""
        api = client(server, cacert)
        show_grant(api.post(f"/v1/grants/{grant_id(api, gid)}/revoke", {"reason": reason}))
