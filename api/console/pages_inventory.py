"""Tenants: a tenant's groups and workloads with their SPIFFE IDs; for the security team, quarantine and
identity revocation on the same page (the API decides who may: the forms are shown to platform roles)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response

from api.console.web import render, see_other, seg, signed_in

router = APIRouter()
PAGE = 50
Reason = Annotated[str, Form(max_length=500)]
Csrf = Annotated[str, Form(max_length=200)]


async def _all(session: Any, path: str, cap: int = 500, **params: Any) -> tuple[list[Any], bool]:
    """Up to `cap` items of a paged listing, and whether there were more."""
    items: list[Any] = []
    cursor = None
    while True:
        page = await session.api.get(path, limit=min(200, cap - len(items)), cursor=cursor, **params)
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if cursor is None or len(items) >= cap:
            return items, cursor is not None


@router.get("/tenants")
async def tenants(request: Request, cursor: Annotated[str | None, Query(max_length=200)] = None,
                  quarantined: Annotated[bool | None, Query()] = None) -> Response:
    session = await signed_in(request)
    if session.me.scope_tenant is not None:
        return see_other(f"/console/tenants/{session.me.scope_tenant}")
    page = await session.api.get("/v1/tenants", limit=PAGE, cursor=cursor, quarantined=quarantined)
    return render(request, session, "tenants.html", tenants=page["items"], next_cursor=page.get("next_cursor"),
                  quarantined=quarantined)


@router.get("/tenants/{tenant}")
async def tenant(request: Request, tenant: str) -> Response:
    session = await signed_in(request)
    t = seg(tenant)
    info = await session.api.get(f"/v1/tenants/{t}")
    groups, more_groups = await _all(session, f"/v1/tenants/{t}/groups")
    workloads, more_workloads = await _all(session, f"/v1/tenants/{t}/workloads")
    by_group: dict[str, list[Any]] = {}
    for w in workloads:
        by_group.setdefault(w["group"], []).append(w)
    return render(request, session, "tenant.html", tenant=info, groups=groups, by_group=by_group,
                  more=more_groups or more_workloads, security=session.me.role in ("security", "admin"))


async def _act(request: Request, csrf: str, path: str, body: dict[str, Any], back: str, notice: str) -> Response:
    session = await signed_in(request, csrf=csrf, change=True)
    await session.api.post(path, body)
    return see_other(f"{back}?notice={notice}")


@router.post("/tenants/{tenant}/quarantine")
async def quarantine_tenant(request: Request, tenant: str, reason: Reason = "", csrf: Csrf = "") -> Response:
    return await _act(request, csrf, f"/v1/tenants/{seg(tenant)}/quarantine", {"reason": reason},
                      f"/console/tenants/{seg(tenant)}", "quarantined")


@router.post("/tenants/{tenant}/unquarantine")
async def unquarantine_tenant(request: Request, tenant: str, reason: Reason = "", csrf: Csrf = "") -> Response:
    return await _act(request, csrf, f"/v1/tenants/{seg(tenant)}/unquarantine", {"reason": reason},
                      f"/console/tenants/{seg(tenant)}", "released")


@router.post("/tenants/{tenant}/groups/{group}/quarantine")
async def quarantine_group(request: Request, tenant: str, group: str, reason: Reason = "",
                           csrf: Csrf = "") -> Response:
    return await _act(request, csrf, f"/v1/tenants/{seg(tenant)}/groups/{seg(group)}/quarantine",
                      {"reason": reason}, f"/console/tenants/{seg(tenant)}", "quarantined")


@router.post("/tenants/{tenant}/groups/{group}/unquarantine")
async def unquarantine_group(request: Request, tenant: str, group: str, reason: Reason = "",
                             csrf: Csrf = "") -> Response:
    return await _act(request, csrf, f"/v1/tenants/{seg(tenant)}/groups/{seg(group)}/unquarantine",
                      {"reason": reason}, f"/console/tenants/{seg(tenant)}", "released")


@router.post("/tenants/{tenant}/groups/{group}/workloads/{name}/revoke")
async def revoke_workload(request: Request, tenant: str, group: str, name: str, reason: Reason = "",
                          csrf: Csrf = "") -> Response:
    return await _act(request, csrf, f"/v1/tenants/{seg(tenant)}/groups/{seg(group)}/workloads/{seg(name)}/revoke",
                      {"reason": reason}, f"/console/tenants/{seg(tenant)}", "identity-revoked")
