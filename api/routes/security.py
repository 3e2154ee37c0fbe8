"""Security actions: quarantine / unquarantine a tenant or group (overrides every grant), revoke a
workload's identities. Each route authorizes and runs one workflow (workflows/security.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.routes.common import request_id
from api.routes.inventory import group_out, tenant_out, workload_out
from api.schemas import (
    COMMON_ERRORS,
    GroupOut,
    QuarantineBody,
    RevokeWorkloadOut,
    SlugPath,
    TenantOut,
    error_responses,
)
from inventory.models import Tenant, WorkloadGroup
from workflows import security

router = APIRouter(prefix="/v1", tags=["security"], route_class=HandedOffRoute)

ERRORS = error_responses(*COMMON_ERRORS, 404, 409)


def _set_tenant(ctx: CtxDep, request: Request, principal: PrincipalDep, tenant: str, reason: str,
                quarantined: bool) -> TenantOut:
    authorize(request, principal, "tenant.quarantine" if quarantined else "tenant.unquarantine", tenant)
    with ctx.db.session() as session:
        target = security.set_quarantine(
            session, tenant=tenant, group=None, quarantined=quarantined, actor=principal.actor(), reason=reason,
            request_id=request_id(request),
        )
        assert isinstance(target, Tenant)
        return tenant_out(target)


def _set_group(ctx: CtxDep, request: Request, principal: PrincipalDep, tenant: str, group: str, reason: str,
               quarantined: bool) -> GroupOut:
    authorize(request, principal, "group.quarantine" if quarantined else "group.unquarantine", tenant)
    with ctx.db.session() as session:
        target = security.set_quarantine(
            session, tenant=tenant, group=group, quarantined=quarantined, actor=principal.actor(), reason=reason,
            request_id=request_id(request),
        )
        assert isinstance(target, WorkloadGroup)
        return group_out(target)


@router.post("/tenants/{tenant}/quarantine", response_model=TenantOut, responses=ERRORS,
             summary="Quarantine a tenant: every flow of it is withdrawn, whatever its grants")
def quarantine_tenant(tenant: SlugPath, body: QuarantineBody, request: Request, ctx: CtxDep,
                      principal: PrincipalDep) -> TenantOut:
    return _set_tenant(ctx, request, principal, tenant, body.reason, True)


@router.post("/tenants/{tenant}/unquarantine", response_model=TenantOut, responses=ERRORS,
             summary="Lift a tenant's quarantine")
def unquarantine_tenant(tenant: SlugPath, body: QuarantineBody, request: Request, ctx: CtxDep,
                        principal: PrincipalDep) -> TenantOut:
    return _set_tenant(ctx, request, principal, tenant, body.reason, False)


@router.post("/tenants/{tenant}/groups/{group}/quarantine", response_model=GroupOut, responses=ERRORS,
             summary="Quarantine a workload group")
def quarantine_group(tenant: SlugPath, group: SlugPath, body: QuarantineBody, request: Request, ctx: CtxDep,
                     principal: PrincipalDep) -> GroupOut:
    return _set_group(ctx, request, principal, tenant, group, body.reason, True)


@router.post("/tenants/{tenant}/groups/{group}/unquarantine", response_model=GroupOut, responses=ERRORS,
             summary="Lift a workload group's quarantine")
def unquarantine_group(tenant: SlugPath, group: SlugPath, body: QuarantineBody, request: Request, ctx: CtxDep,
                       principal: PrincipalDep) -> GroupOut:
    return _set_group(ctx, request, principal, tenant, group, body.reason, False)


@router.post("/tenants/{tenant}/groups/{group}/workloads/{name}/revoke", response_model=RevokeWorkloadOut,
             responses=ERRORS, summary="Revoke every identity of a workload (SVIDs revoked, flows withdrawn)")
def revoke_workload(tenant: SlugPath, group: SlugPath, name: SlugPath, body: QuarantineBody, request: Request,
                    ctx: CtxDep, principal: PrincipalDep) -> RevokeWorkloadOut:
    authorize(request, principal, "svid.revoke", tenant)
    with ctx.db.session() as session:
        workload, serials = security.revoke_workload(
            session, tenant=tenant, group=group, name=name, reason=body.reason, actor=principal.actor(),
            scope_tenant=principal.scope_tenant, clock=ctx.clock, request_id=request_id(request),
        )
        return RevokeWorkloadOut(workload=workload_out(workload), revoked_serials=serials)
