"""Grants: request one (with the policy's live answer before submitting), my requests and their state,
requests waiting for my approval with approve / reject, revoke."""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response

from api.console.client import ApiError
from api.console.web import Session, duration, render, see_other, seg, signed_in
from core.digits import is_digits

router = APIRouter()
TENANT_ROLES = ("tenant-admin", "tenant-member")
TTLS = [(s, duration(s)) for s in (3600, 8 * 3600, 86400, 3 * 86400, 7 * 86400)]  # "1 hour" ... "7 days"
STATES = ("pending", "active", "expired", "revoked", "rejected", "denied")
Csrf = Annotated[str, Form(max_length=200)]
Text = Annotated[str, Form(max_length=2000)]
OptTenant = Annotated[str | None, Query(max_length=63)]


def my_approver_name(session: Session) -> str | None:
    if session.me.role == "security":
        return "security"
    if session.me.role == "tenant-admin" and session.me.tenant:
        return f"tenant-admin:{session.me.tenant}"
    return None


def parse_ports(text: str) -> list[int]:
    """'443, 8443' -> [443, 8443]; ValueError with a readable message otherwise."""
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts:
        raise ValueError("give at least one port number")
    if len(parts) > 64 or not all(is_digits(p) and len(p) <= 5 for p in parts):
        raise ValueError("ports are numbers separated by commas, e.g. 443, 8443")
    ports = [int(p) for p in parts]
    # the API's bound (0-65535), said here in the form's words: it answered `body.ports.0: Input should be less
    # than or equal to 65535`, naming a JSON path the person never typed
    if beyond := [p for p in ports if p > 65535]:
        raise ValueError(f"{beyond[0]} is not a port number: ports go up to 65535")
    return ports


async def _waiting(session: Session) -> tuple[list[Any], bool]:
    """Pending grants that name me as an approver who has not approved yet (first 200 pending looked at)."""
    name = my_approver_name(session)
    if name is None:
        return [], False
    dst = session.me.tenant if name.startswith("tenant-admin:") else None
    page = await session.api.get("/v1/grants", state="pending", dst_tenant=dst, limit=200)
    return [g for g in page["items"] if name in g["pending_approvers"]], page.get("next_cursor") is not None


@router.get("/grants")
async def grants(
    request: Request, state: Annotated[str | None, Query(max_length=16)] = None,
    src_tenant: OptTenant = None, dst_tenant: OptTenant = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    session = await signed_in(request)
    scope = session.me.scope_tenant
    if scope is not None and src_tenant is None and dst_tenant is None:
        src_tenant = scope  # "my requests"
    listing = await session.api.get("/v1/grants", state=state if state in STATES else None, src_tenant=src_tenant,
                                    dst_tenant=dst_tenant, cursor=cursor, limit=50)
    waiting, more_waiting = await _waiting(session)
    groups: list[Any] = []
    if scope is not None:
        groups = (await session.api.get(f"/v1/tenants/{seg(scope)}/groups", limit=200))["items"]
    return render(request, session, "grants.html", grants=listing["items"], next_cursor=listing.get("next_cursor"),
                  waiting=waiting, more_waiting=more_waiting, groups=groups, ttls=TTLS, states=STATES,
                  state=state, src_tenant=src_tenant or "", dst_tenant=dst_tenant or "",
                  can_request=session.me.role in (*TENANT_ROLES, "admin"), idempotency_key=secrets.token_hex(16))


@router.get("/grants/preview")
async def preview(
    request: Request, src_group: Annotated[str, Query(max_length=63)] = "",
    dst_tenant: Annotated[str, Query(max_length=63)] = "", dst_group: Annotated[str, Query(max_length=63)] = "",
    proto: Annotated[str, Query(max_length=8)] = "tcp", ports: Annotated[str, Query(max_length=400)] = "",
    ttl_seconds: Annotated[int, Query(ge=1, le=365 * 86400)] = 3600,
    src_tenant: Annotated[str, Query(max_length=63)] = "",
) -> Response:
    """The policy's answer to the form as it stands (GET /v1/policy/explain-grant): nothing is written."""
    session = await signed_in(request)
    answer: dict[str, Any] | None = None
    problem = None
    status = 200
    if not (src_group and dst_tenant and dst_group and ports.strip()):
        problem = "Fill in the source group, destination tenant and group, and the ports to see the policy's answer."
    else:
        try:
            answer = await session.api.get(
                "/v1/policy/explain-grant", src_group=src_group, dst_tenant=dst_tenant, dst_group=dst_group,
                proto=proto, ports=parse_ports(ports), ttl_seconds=ttl_seconds, src_tenant=src_tenant or None)
        except ValueError as exc:
            problem, status = str(exc), 400
        except ApiError as exc:
            problem, status = f"The API refused the question: {exc.reason}", exc.status
    return render(request, session, "preview.html", status=status, answer=answer, problem=problem)


@router.post("/grants")
async def request_grant(
    request: Request, csrf: Csrf = "", src_group: Text = "", dst_tenant: Text = "", dst_group: Text = "",
    proto: Text = "tcp", ports: Text = "", ttl_seconds: Annotated[int, Form(ge=1, le=365 * 86400)] = 3600,
    justification: Text = "", src_tenant: Text = "", idempotency_key: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    session = await signed_in(request, csrf=csrf, change=True)
    try:
        port_list = parse_ports(ports)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    body: dict[str, Any] = {"src_group": src_group, "dst_tenant": dst_tenant, "dst_group": dst_group,
                            "proto": proto, "ports": port_list, "ttl_seconds": ttl_seconds,
                            "justification": justification}
    if src_tenant:
        body["src_tenant"] = src_tenant
    headers = {"Idempotency-Key": idempotency_key} if re.fullmatch(r"[0-9a-f]{32}", idempotency_key) else None
    grant = await session.api.post("/v1/grants", body, headers=headers)
    return see_other(f"/console/grants/{seg(grant['id'])}?notice=requested")


@router.get("/grants/{grant_id}")
async def grant(request: Request, grant_id: str) -> Response:
    session = await signed_in(request)
    g = await session.api.get(f"/v1/grants/{seg(grant_id)}")
    name = my_approver_name(session)
    return render(request, session, "grant.html", grant=g,
                  can_decide=name is not None and name in g["pending_approvers"],
                  can_revoke=g["state"] in ("pending", "active") and session.me.role in ("tenant-admin", "security",
                                                                                         "admin"))


async def _decide(request: Request, csrf: str, grant_id: str, verb: str, body: dict[str, Any], notice: str
                  ) -> Response:
    session = await signed_in(request, csrf=csrf, change=True)
    await session.api.post(f"/v1/grants/{seg(grant_id)}/{verb}", body)
    return see_other(f"/console/grants/{seg(grant_id)}?notice={notice}")


@router.post("/grants/{grant_id}/approve")
async def approve(request: Request, grant_id: str, csrf: Csrf = "",
                  comment: Annotated[str, Form(max_length=500)] = "") -> Response:
    return await _decide(request, csrf, grant_id, "approve", {"comment": comment}, "approved")


@router.post("/grants/{grant_id}/reject")
async def reject(request: Request, grant_id: str, csrf: Csrf = "",
                 reason: Annotated[str, Form(max_length=500)] = "") -> Response:
    return await _decide(request, csrf, grant_id, "reject", {"reason": reason}, "rejected")


@router.post("/grants/{grant_id}/revoke")
async def revoke(request: Request, grant_id: str, csrf: Csrf = "",
                 reason: Annotated[str, Form(max_length=500)] = "") -> Response:
    return await _decide(request, csrf, grant_id, "revoke", {"reason": reason}, "revoked")
