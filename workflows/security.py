"""Security actions that span domains: quarantine a tenant or a group (inventory state that overrides every
grant in the policy data), and revoke a workload's identity (pki revokes every SVID and the identity
prefix, inventory marks the workload revoked, so its flows are withdrawn). Each change and its audit
events commit in the caller's one session."""

from __future__ import annotations

from sqlmodel import Session

from audit import Actor, record
from core.clock import Clock, system_clock
from core.errors import Conflict
from inventory import service as inventory
from inventory.models import Tenant, Workload, WorkloadGroup
from pki.revocation import revoke


def set_quarantine(
    session: Session, *, tenant: str, group: str | None, quarantined: bool, actor: Actor, reason: str,
    request_id: str | None = None,
) -> Tenant | WorkloadGroup:
    """Quarantine (or lift the quarantine of) a tenant, or one group when `group` is given; a request
    that changes nothing is a Conflict."""
    return inventory.set_quarantine(
        session, tenant=tenant, group=group, quarantined=quarantined, actor=actor, reason=reason,
        request_id=request_id,
    )


def revoke_workload(
    session: Session, *, tenant: str, group: str, name: str, reason: str, actor: Actor, scope_tenant: str | None,
    clock: Clock = system_clock, request_id: str | None = None,
) -> tuple[Workload, list[str]]:
    """Revoke every identity of a registered workload: (the workload, the serials revoked)."""
    workload = inventory.get_workload(session, tenant, group, name)
    if workload.revoked:
        raise Conflict(f"workload {workload.spiffe_id} is already revoked")
    serials = revoke(
        session, tenant=tenant, group=group, workload=name, reason=reason, actor=actor,
        scope_tenant=scope_tenant, clock=clock, request_id=request_id,
    )
    workload.revoked = True
    session.add(workload)
    session.flush()
    record(
        session, actor=actor, action="workload.revoke", object_type="workload", object_id=workload.spiffe_id,
        tenant=tenant, summary={"serials": serials, "revoked": True}, reason=reason, request_id=request_id,
        at=clock(),
    )
    return workload, serials
