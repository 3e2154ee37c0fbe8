"""Inventory and grants written straight into the real database for policy tests."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session

from inventory.models import Tenant, Workload, WorkloadGroup
from policy.models import Grant


def add_tenant(s: Session, slug: str, now: datetime, *, quarantined: bool = False) -> None:
    s.add(Tenant(slug=slug, display_name=slug.title(), quarantined=quarantined, created_at=now))


def add_group(s: Session, tenant: str, name: str, ports: list[tuple[str, int]], now: datetime, *,
              sensitivity: str = "normal", quarantined: bool = False, labels: dict[str, str] | None = None) -> None:
    s.add(WorkloadGroup(tenant=tenant, name=name, labels=labels or {}, sensitivity=sensitivity,
                        ports=[{"proto": p, "port": n} for p, n in ports], quarantined=quarantined, created_at=now))


def add_workload(s: Session, tenant: str, group: str, name: str, now: datetime, *, revoked: bool = False) -> str:
    sid = f"spiffe://td.example/tenant/{tenant}/group/{group}/{name}"
    s.add(Workload(tenant=tenant, group=group, name=name, spiffe_id=sid, revoked=revoked, created_at=now))
    return sid


def add_grant(s: Session, gid: str, src: tuple[str, str], dst: tuple[str, str], ports: list[int], now: datetime, *,
              state: str = "active", expires_in: timedelta | None = timedelta(hours=1), proto: str = "tcp") -> None:
    s.add(Grant(id=gid, src_tenant=src[0], src_group=src[1], dst_tenant=dst[0], dst_group=dst[1], proto=proto,
                ports=ports, ttl_seconds=3600, state=state, requested_by="tester", requester_tenant="",
                created_at=now, expires_at=(now + expires_in) if expires_in is not None else None))


def populate(s: Session, now: datetime) -> dict[str, str]:
    """acme (web, db sensitive), globex (api), evil (quarantined), platform (dns); grants of every kind."""
    for slug in ("acme", "globex", "platform"):
        add_tenant(s, slug, now)
    add_tenant(s, "evil", now, quarantined=True)
    s.flush()
    add_group(s, "acme", "web", [("tcp", 443)], now)
    add_group(s, "acme", "db", [("tcp", 5432)], now, sensitivity="sensitive")
    add_group(s, "globex", "api", [("tcp", 8443), ("tcp", 9443)], now)
    add_group(s, "evil", "bot", [("tcp", 80)], now)
    add_group(s, "platform", "dns", [("udp", 53)], now)
    s.flush()
    ids = {
        "good": add_workload(s, "acme", "web", "w1", now),
        "revoked": add_workload(s, "acme", "web", "w2", now, revoked=True),
    }
    add_grant(s, "live", ("acme", "web"), ("globex", "api"), [8443], now)
    add_grant(s, "expired-but-active", ("acme", "db"), ("globex", "api"), [9443], now, expires_in=timedelta(0))
    add_grant(s, "pending", ("globex", "api"), ("acme", "web"), [443], now, state="pending")
    add_grant(s, "revoked", ("globex", "api"), ("acme", "db"), [5432], now, state="revoked")
    add_grant(s, "no-expiry", ("globex", "api"), ("acme", "web"), [443], now, expires_in=None)
    return ids
