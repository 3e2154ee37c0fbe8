"""Tenants, workload groups and workloads. Thin: parse, authorize (api_authz.rego), call inventory.service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.patterns import SENSITIVITY_PATTERN
from api.routes.common import decode_cursor, denial_logged, encode_cursor, request_id
from api.schemas import (
    COMMON_ERRORS,
    CursorQuery,
    GroupCreate,
    GroupOut,
    LimitQuery,
    Page,
    SlugPath,
    TenantCreate,
    TenantOut,
    WorkloadCreate,
    WorkloadOut,
    error_responses,
)
from core.clock import as_utc
from core.errors import Forbidden, InvalidInput
from inventory import service
from inventory.models import Tenant, Workload, WorkloadGroup
from workflows import fabric
from workflows.context import trust_domain
from workflows.fabric import Who

router = APIRouter(prefix="/v1", tags=["inventory"], route_class=HandedOffRoute)

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
WRITE_ERRORS = error_responses(*COMMON_ERRORS, 404, 409)


def tenant_out(t: Tenant) -> TenantOut:
    return TenantOut(slug=t.slug, display_name=t.display_name, l3vni=t.l3vni, prefix=t.prefix,
                     quarantined=t.quarantined, created_at=as_utc(t.created_at), vlan=t.vlan, prefix6=t.prefix6)


def group_out(g: WorkloadGroup) -> GroupOut:
    return GroupOut(tenant=g.tenant, name=g.name, labels=dict(g.labels), ports=list(g.ports),
                    sensitivity=g.sensitivity, quarantined=g.quarantined, created_at=as_utc(g.created_at))


def workload_out(w: Workload) -> WorkloadOut:
    return WorkloadOut(tenant=w.tenant, group=w.group, name=w.name, spiffe_id=w.spiffe_id, revoked=w.revoked,
                       created_at=as_utc(w.created_at))


@router.post("/tenants", status_code=201, response_model=TenantOut, responses=WRITE_ERRORS,
             summary="Create a tenant (admin)")
def create_tenant(body: TenantCreate, request: Request, ctx: CtxDep, principal: PrincipalDep) -> TenantOut:
    authorize(request, principal, "tenant.create", None)
    if principal.scope_tenant is not None:
        raise Forbidden("tenant principals cannot create tenants")
    with ctx.db.session() as session:
        tenant = fabric.create_tenant(
            session, Who(principal.actor(), ctx.clock, request_id(request)), ctx.settings.pools(), slug=body.slug,
            display_name=body.display_name, l3vni=body.l3vni, prefix=body.prefix, vlan=body.vlan,
            prefix6=body.prefix6)
        return tenant_out(tenant)


@router.get("/tenants", response_model=Page[TenantOut], responses=READ_ERRORS,
            summary="List tenants (a tenant principal sees only its own)")
def list_tenants(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    cursor: CursorQuery = None, limit: LimitQuery = 50,
    quarantined: Annotated[bool | None, Query(description="only (un)quarantined tenants")] = None,
) -> Page[TenantOut]:
    scope = principal.scope_tenant
    authorize(request, principal, "tenant.read", scope)
    after = decode_cursor(cursor) if cursor is not None else None
    with ctx.db.read_session() as session:
        rows = service.page_tenants(session, only=scope, quarantined=quarantined, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[TenantOut](items=[tenant_out(t) for t in rows],
                           next_cursor=encode_cursor(rows[-1].slug) if more else None)


@router.get("/tenants/{tenant}", response_model=TenantOut, responses=READ_ERRORS, summary="One tenant")
def get_tenant(tenant: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> TenantOut:
    authorize(request, principal, "tenant.read", tenant)
    with ctx.db.read_session() as session:
        return tenant_out(service.get_tenant(session, tenant))


@router.post("/tenants/{tenant}/groups", status_code=201, response_model=GroupOut, responses=WRITE_ERRORS,
             summary="Create a workload group in a tenant")
def create_group(
    tenant: SlugPath, body: GroupCreate, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> GroupOut:
    authorize(request, principal, "inventory.write", tenant)
    with ctx.db.session() as session:
        group = service.create_group(
            session, tenant=tenant, name=body.name, labels=body.labels,
            ports=[p.model_dump() for p in body.ports], sensitivity=body.sensitivity,
            actor=principal.actor(), clock=ctx.clock, request_id=request_id(request), quotas=ctx.settings.quotas,
        )
        return group_out(group)


@router.get("/tenants/{tenant}/groups", response_model=Page[GroupOut], responses=READ_ERRORS,
            summary="List a tenant's workload groups")
def list_groups(
    tenant: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep,
    cursor: CursorQuery = None, limit: LimitQuery = 50,
    sensitivity: Annotated[str | None, Query(pattern=SENSITIVITY_PATTERN)] = None,
) -> Page[GroupOut]:
    authorize(request, principal, "inventory.read", tenant)
    after = decode_cursor(cursor) if cursor is not None else None
    with ctx.db.read_session() as session:
        rows = service.page_groups(session, tenant, sensitivity=sensitivity, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[GroupOut](items=[group_out(g) for g in rows],
                          next_cursor=encode_cursor(rows[-1].name) if more else None)


@router.get("/tenants/{tenant}/groups/{group}", response_model=GroupOut, responses=READ_ERRORS,
            summary="One workload group")
def get_group(tenant: SlugPath, group: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> GroupOut:
    authorize(request, principal, "inventory.read", tenant)
    with ctx.db.read_session() as session:
        return group_out(service.get_group(session, tenant, group))


@router.post("/tenants/{tenant}/groups/{group}/workloads", status_code=201, response_model=WorkloadOut,
             responses=WRITE_ERRORS, summary="Register a workload (its SPIFFE ID is derived, never chosen)")
def register_workload(
    tenant: SlugPath, group: SlugPath, body: WorkloadCreate, request: Request, ctx: CtxDep,
    principal: PrincipalDep,
) -> WorkloadOut:
    authorize(request, principal, "inventory.write", tenant)
    resource = {"tenant": tenant, "group": group, "workload": body.name}
    with denial_logged(ctx, principal, "workload.register", resource), ctx.db.session() as session:
        workload = service.register_workload(
            session, trust_domain=trust_domain(ctx, session), tenant=tenant, group=group, name=body.name,
            actor=principal.actor(), clock=ctx.clock, request_id=request_id(request), quotas=ctx.settings.quotas,
        )
        return workload_out(workload)


@router.get("/tenants/{tenant}/workloads", response_model=Page[WorkloadOut], responses=READ_ERRORS,
            summary="List a tenant's registered workloads")
def list_workloads(
    tenant: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep,
    cursor: CursorQuery = None, limit: LimitQuery = 50,
    group: Annotated[str | None, Query(min_length=1, max_length=63)] = None,
    revoked: bool | None = None,
) -> Page[WorkloadOut]:
    authorize(request, principal, "inventory.read", tenant)
    after_id = None
    if cursor is not None:
        try:
            after_id = int(decode_cursor(cursor))
        except ValueError:
            raise InvalidInput("cursor is not one this API returned") from None
    with ctx.db.read_session() as session:
        rows = service.page_workloads(session, tenant, group=group, revoked=revoked, after_id=after_id,
                                      limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[WorkloadOut](items=[workload_out(w) for w in rows],
                             next_cursor=encode_cursor(str(rows[-1].id)) if more else None)


@router.get("/tenants/{tenant}/groups/{group}/workloads/{name}", response_model=WorkloadOut,
            responses=READ_ERRORS, summary="One registered workload")
def get_workload(
    tenant: SlugPath, group: SlugPath, name: SlugPath, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> WorkloadOut:
    authorize(request, principal, "inventory.read", tenant)
    with ctx.db.read_session() as session:
        return workload_out(service.get_workload(session, tenant, group, name))
