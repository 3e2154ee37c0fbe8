"""Inventory changes. Each takes the caller's session and records its audit event in it."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlmodel import Session, col, func, select

from audit import Actor, record
from core.clock import Clock, system_clock
from core.quotas import QuotaName, Quotas
from core.slugs import require_slug
from inventory.errors import (
    AlreadyExists,
    GroupNotFound,
    InvalidInventory,
    Quarantined,
    TenantNotFound,
    WorkloadNotFound,
)
from inventory.models import Tenant, Workload, WorkloadGroup

PROTOCOLS = ("tcp", "udp")
SENSITIVITIES = ("normal", "sensitive")
MAX_LABELS = 32


def normalize_ports(ports: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Sorted, de-duplicated [{"proto", "port"}]; rejects wildcards and out-of-range ports."""
    seen: set[tuple[str, int]] = set()
    for entry in ports:
        proto, port = entry.get("proto"), entry.get("port")
        if proto not in PROTOCOLS:
            raise InvalidInventory(f"port protocol must be one of {', '.join(PROTOCOLS)}, got {proto!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise InvalidInventory(f"port must be an integer in 1..65535, got {port!r}")
        seen.add((str(proto), port))
    return [{"proto": p, "port": n} for p, n in sorted(seen)]


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise InvalidInventory(f"at most {MAX_LABELS} labels")
    for k, v in labels.items():
        if not (isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 63 and len(v) <= 253):
            raise InvalidInventory("labels are string keys (1-63 chars) to string values (<= 253 chars)")
    return dict(sorted(labels.items()))


def get_tenant(session: Session, slug: str) -> Tenant:
    tenant = session.get(Tenant, slug)
    if tenant is None:
        raise TenantNotFound(f"tenant {slug!r} not found")
    return tenant


def check_quota(session: Session, quotas: Quotas | None, tenant: str, name: QuotaName, held: Any) -> None:
    """QuotaExceeded when `tenant` may not add one more of `name`; `held` is a COUNT statement. The tenant's
    row is locked first (PostgreSQL; SQLite's writer lock serialises writers already), so two concurrent
    additions cannot both pass the last free place."""
    if quotas is None or getattr(quotas, name) <= 0:
        return
    session.exec(select(Tenant.slug).where(col(Tenant.slug) == tenant).with_for_update()).first()
    quotas.check(tenant, name, int(session.exec(held).one()))


def get_group(session: Session, tenant: str, name: str) -> WorkloadGroup:
    group = session.exec(
        select(WorkloadGroup).where(WorkloadGroup.tenant == tenant, WorkloadGroup.name == name)
    ).first()
    if group is None:
        raise GroupNotFound(f"group {name!r} not found in tenant {tenant!r}")
    return group


def get_workload(session: Session, tenant: str, group: str, name: str) -> Workload:
    workload = session.exec(
        select(Workload).where(Workload.tenant == tenant, Workload.group == group, Workload.name == name)
    ).first()
    if workload is None:
        raise WorkloadNotFound(f"workload {name!r} not registered in {tenant}/{group}")
    return workload


def require_not_quarantined(session: Session, tenant: str, group: str) -> None:
    """Quarantined (403) when the tenant or the group is quarantined: a quarantined tenant or group gets no
    identities and no new workloads. One indexed read (on the SVID issuance path). A missing tenant or
    group is left to the caller's own lookup."""
    row = session.exec(
        select(Tenant.quarantined, WorkloadGroup.quarantined)
        .join(WorkloadGroup, col(WorkloadGroup.tenant) == col(Tenant.slug))
        .where(col(Tenant.slug) == tenant, col(WorkloadGroup.name) == group)
    ).first()
    if row is None:
        return
    tenant_quarantined, group_quarantined = row
    if tenant_quarantined:
        raise Quarantined(f"tenant {tenant} is quarantined: no identities are issued and no workloads registered "
                          "until security lifts the quarantine")
    if group_quarantined:
        raise Quarantined(f"group {tenant}/{group} is quarantined: no identities are issued and no workloads "
                          "registered in it until security lifts the quarantine")


def workload_by_spiffe_id(session: Session, spiffe_id: str) -> Workload | None:
    """The registered workload holding this SPIFFE ID, or None."""
    return session.exec(select(Workload).where(Workload.spiffe_id == spiffe_id)).first()


def create_tenant(
    session: Session,
    *,
    slug: str,
    display_name: str,
    actor: Actor,
    l3vni: int | None = None,
    prefix: str | None = None,
    vlan: int | None = None,
    prefix6: str | None = None,
    clock: Clock = system_clock,
    request_id: str | None = None,
) -> Tenant:
    """A new tenant with the addressing given (workflows.fabric.create_tenant allocates what is missing from
    the configured pools and checks it against every other tenant first)."""
    require_slug(slug, "tenant")
    if not display_name or len(display_name) > 200:
        raise InvalidInventory("display name must be 1-200 characters")
    l3vni, vlan, prefix, prefix6 = _addressing(l3vni, vlan, prefix, prefix6)
    if session.get(Tenant, slug) is not None:
        raise AlreadyExists(f"tenant {slug!r} already exists")
    _unique_addressing(session, slug, l3vni, vlan)
    tenant = Tenant(slug=slug, display_name=display_name, l3vni=l3vni, prefix=prefix, vlan=vlan, prefix6=prefix6,
                    created_at=clock())
    session.add(tenant)
    session.flush()
    summary: dict[str, Any] = {"display_name": display_name, "l3vni": l3vni, "prefix": prefix}
    if vlan is not None or prefix6 is not None:
        summary.update(vlan=vlan, prefix6=prefix6)
    record(
        session, actor=actor, action="tenant.create", object_type="tenant", object_id=slug, tenant=slug,
        summary=summary, request_id=request_id,
    )
    return tenant


def _addressing(l3vni: int | None, vlan: int | None, prefix: str | None, prefix6: str | None
                ) -> tuple[int | None, int | None, str | None, str | None]:
    if l3vni is not None and not 1 <= l3vni <= 16_777_215:
        raise InvalidInventory("l3vni must be in 1..16777215 (24-bit VXLAN network identifier)")
    if vlan is not None and not 2 <= vlan <= 4094:
        raise InvalidInventory("vlan must be in 2..4094 (the attachment VLAN, also the tenant's conntrack zone)")
    out: list[str | None] = []
    for name, value, version in (("prefix", prefix, 4), ("prefix6", prefix6, 6)):
        if value is None:
            out.append(None)
            continue
        try:
            net = ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise InvalidInventory(f"{name} {value!r} is not a CIDR network: {exc}") from None
        if name == "prefix6" and net.version != version:
            raise InvalidInventory(f"prefix6 {value!r} is not an IPv6 network")
        out.append(str(net))
    return l3vni, vlan, out[0], out[1]


def _unique_addressing(session: Session, slug: str, l3vni: int | None, vlan: int | None) -> None:
    if l3vni is not None and session.exec(
            select(Tenant).where(Tenant.l3vni == l3vni, col(Tenant.slug) != slug)).first():
        raise AlreadyExists(f"l3vni {l3vni} is already allocated to another tenant")
    if vlan is not None and session.exec(select(Tenant).where(Tenant.vlan == vlan, col(Tenant.slug) != slug)).first():
        raise AlreadyExists(f"vlan {vlan} is already allocated to another tenant")


def fill_addressing(
    session: Session, *, slug: str, l3vni: int | None, vlan: int | None, prefix: str | None, prefix6: str | None,
    actor: Actor, clock: Clock = system_clock, request_id: str | None = None,
) -> Tenant:
    """Give a tenant the addressing it lacks (allocated by the caller; a tenant made before the fabric
    existed has no VLAN). Values it already has never change: a differing one is a Conflict."""
    tenant = get_tenant(session, slug)
    l3vni, vlan, prefix, prefix6 = _addressing(l3vni, vlan, prefix, prefix6)
    wanted = {"l3vni": l3vni, "vlan": vlan, "prefix": prefix, "prefix6": prefix6}
    filled: dict[str, Any] = {}
    for name, value in wanted.items():
        have = getattr(tenant, name)
        if value is None or value == have:
            continue
        if have is not None:
            raise AlreadyExists(f"tenant {slug} has {name} {have}; it cannot become {value}")
        filled[name] = value
    if not filled:
        return tenant
    _unique_addressing(session, slug, filled.get("l3vni"), filled.get("vlan"))
    for name, value in filled.items():
        setattr(tenant, name, value)
    session.add(tenant)
    session.flush()
    record(session, actor=actor, action="tenant.allocate", object_type="tenant", object_id=slug, tenant=slug,
           summary=filled, request_id=request_id, at=clock())
    return tenant


def create_group(
    session: Session,
    *,
    tenant: str,
    name: str,
    actor: Actor,
    labels: Mapping[str, str] | None = None,
    ports: Sequence[Mapping[str, Any]] = (),
    sensitivity: str = "normal",
    clock: Clock = system_clock,
    request_id: str | None = None,
    quotas: Quotas | None = None,
) -> WorkloadGroup:
    require_slug(name, "group")
    get_tenant(session, tenant)
    check_quota(session, quotas, tenant, "groups",
                select(func.count()).select_from(WorkloadGroup).where(col(WorkloadGroup.tenant) == tenant))
    if sensitivity not in SENSITIVITIES:
        raise InvalidInventory(f"sensitivity must be one of {', '.join(SENSITIVITIES)}")
    clean_ports = normalize_ports(ports)
    clean_labels = _labels(labels or {})
    if session.exec(
        select(WorkloadGroup).where(WorkloadGroup.tenant == tenant, WorkloadGroup.name == name)
    ).first():
        raise AlreadyExists(f"group {name!r} already exists in tenant {tenant!r}")
    group = WorkloadGroup(
        tenant=tenant, name=name, labels=clean_labels, ports=clean_ports, sensitivity=sensitivity,
        created_at=clock(),
    )
    session.add(group)
    session.flush()
    record(
        session, actor=actor, action="group.create", object_type="group", object_id=f"{tenant}/{name}",
        tenant=tenant, summary={"labels": clean_labels, "ports": clean_ports, "sensitivity": sensitivity},
        request_id=request_id,
    )
    return group


def register_workload(
    session: Session,
    *,
    trust_domain: str,
    tenant: str,
    group: str,
    name: str,
    actor: Actor,
    clock: Clock = system_clock,
    request_id: str | None = None,
    quotas: Quotas | None = None,
) -> Workload:
    """The SPIFFE ID is derived here, from tenant/group/name: nothing the caller sends can choose it."""
    require_slug(name, "workload")
    get_group(session, tenant, group)
    require_not_quarantined(session, tenant, group)
    check_quota(session, quotas, tenant, "workloads",
                select(func.count()).select_from(Workload).where(col(Workload.tenant) == tenant))
    spiffe_id = f"spiffe://{trust_domain}/tenant/{tenant}/group/{group}/{name}"
    if session.exec(select(Workload).where(Workload.spiffe_id == spiffe_id)).first():
        raise AlreadyExists(f"workload {spiffe_id} is already registered")
    workload = Workload(tenant=tenant, group=group, name=name, spiffe_id=spiffe_id, created_at=clock())
    session.add(workload)
    session.flush()
    record(
        session, actor=actor, action="workload.register", object_type="workload", object_id=spiffe_id,
        tenant=tenant, summary={"group": group, "name": name}, request_id=request_id,
    )
    return workload


def set_quarantine(
    session: Session,
    *,
    tenant: str,
    group: str | None,
    quarantined: bool,
    actor: Actor,
    reason: str,
    request_id: str | None = None,
) -> Tenant | WorkloadGroup:
    """Quarantine overrides every grant; the reason is mandatory because someone will ask later."""
    if not reason.strip():
        raise InvalidInventory("a quarantine change needs a reason")
    target: Tenant | WorkloadGroup = get_tenant(session, tenant) if group is None else get_group(
        session, tenant, group
    )
    before = target.quarantined
    if before == quarantined:
        # No change, so no audit event: the log records changes, not repeated requests.
        name = tenant if group is None else f"{tenant}/{group}"
        raise AlreadyExists(f"{name} is already {'quarantined' if quarantined else 'not quarantined'}")
    target.quarantined = quarantined
    session.add(target)
    session.flush()
    object_type = "tenant" if group is None else "group"
    record(
        session, actor=actor, action=f"{object_type}.{'quarantine' if quarantined else 'unquarantine'}",
        object_type=object_type, object_id=tenant if group is None else f"{tenant}/{group}", tenant=tenant,
        summary={"before": {"quarantined": before}, "after": {"quarantined": quarantined}}, reason=reason,
        request_id=request_id,
    )
    return target


def list_tenants(session: Session, *, after: str | None = None, limit: int = 100) -> list[Tenant]:
    query = select(Tenant).order_by(col(Tenant.slug)).limit(limit)
    if after is not None:
        query = query.where(col(Tenant.slug) > after)
    return list(session.exec(query).all())


def list_groups(session: Session, tenant: str) -> list[WorkloadGroup]:
    query = select(WorkloadGroup).where(WorkloadGroup.tenant == tenant)
    return list(session.exec(query.order_by(col(WorkloadGroup.name))))


def list_workloads(session: Session, tenant: str, group: str | None = None) -> list[Workload]:
    query = select(Workload).where(Workload.tenant == tenant)
    if group is not None:
        query = query.where(Workload.group == group)
    return list(session.exec(query.order_by(col(Workload.group), col(Workload.name))))


def page_tenants(
    session: Session, *, only: str | None = None, quarantined: bool | None = None, after: str | None = None,
    limit: int = 100,
) -> list[Tenant]:
    """Tenants by slug after the cursor `after`; `only` confines the page to one tenant (a tenant's view)."""
    query = select(Tenant).order_by(col(Tenant.slug)).limit(limit)
    if only is not None:
        query = query.where(col(Tenant.slug) == only)
    if quarantined is not None:
        query = query.where(col(Tenant.quarantined) == quarantined)
    if after is not None:
        query = query.where(col(Tenant.slug) > after)
    return list(session.exec(query).all())


def page_groups(
    session: Session, tenant: str, *, sensitivity: str | None = None, after: str | None = None, limit: int = 100,
) -> list[WorkloadGroup]:
    """A tenant's groups by name after the cursor `after`; TenantNotFound for an unknown tenant."""
    get_tenant(session, tenant)
    query = select(WorkloadGroup).where(col(WorkloadGroup.tenant) == tenant)
    if sensitivity is not None:
        query = query.where(col(WorkloadGroup.sensitivity) == sensitivity)
    if after is not None:
        query = query.where(col(WorkloadGroup.name) > after)
    return list(session.exec(query.order_by(col(WorkloadGroup.name)).limit(limit)).all())


def page_workloads(
    session: Session, tenant: str, *, group: str | None = None, revoked: bool | None = None,
    after_id: int | None = None, limit: int = 100,
) -> list[Workload]:
    """A tenant's workloads in registration order after the row id `after_id`; TenantNotFound for an
    unknown tenant."""
    get_tenant(session, tenant)
    query = select(Workload).where(col(Workload.tenant) == tenant)
    if group is not None:
        query = query.where(col(Workload.group) == group)
    if revoked is not None:
        query = query.where(col(Workload.revoked) == revoked)
    if after_id is not None:
        query = query.where(col(Workload.id) > after_id)
    return list(session.exec(query.order_by(col(Workload.id)).limit(limit)).all())
