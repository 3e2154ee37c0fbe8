"""The data document from the real database (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.errors import InvalidInput
from policy.data import build_data, to_ns
from policy.decide import decide_flow, decide_grant_request, flow_input
from policy.engines.embedded import RegorusEngine
from store.db import Database
from tests.policy.dbutil import add_grant, populate
from tests.policy.helpers import shipped

NOW = datetime.now(UTC).replace(microsecond=0)  # decisions judge expiry against the clock


def test_build_data_reads_inventory_and_only_live_grants(db: Database) -> None:
    with db.session() as s:
        ids = populate(s, NOW)
    with db.read_session() as s:
        data = build_data(s, NOW)
    tf = data["tf"]
    assert set(tf["tenants"]) == {"acme", "globex", "evil", "platform"}
    assert tf["tenants"]["evil"]["quarantined"] is True
    assert tf["tenants"]["acme"]["groups"]["db"]["sensitivity"] == "sensitive"
    assert tf["tenants"]["globex"]["groups"]["api"]["exposed"] == {"tcp": [8443, 9443]}
    assert tf["revoked"] == {ids["revoked"]: True}
    # only `live`: expired-at-now, pending, revoked and active-without-expiry are all left out
    assert tf["grants"] == {"acme": {"globex": {"live": {
        "src_group": "web", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "expires_at_ns": to_ns(NOW + timedelta(hours=1))}}}}
    assert "now_ns" not in tf  # rebuilding at another instant must not look like a change
    # an hour later the live grant has expired too
    with db.read_session() as s:
        assert build_data(s, NOW + timedelta(hours=1))["tf"]["grants"] == {}


def test_decisions_on_database_data(db: Database) -> None:
    with db.session() as s:
        ids = populate(s, NOW)
    with db.read_session() as s:
        data = build_data(s, NOW)
    engine = RegorusEngine(shipped(), data)
    assert decide_flow(engine, flow_input("acme/web", "globex/api", 8443)).allow
    assert not decide_flow(engine, flow_input("acme/db", "globex/api", 9443)).allow  # expired at now
    assert not decide_flow(engine, flow_input(ids["revoked"], "acme/db", 5432)).allow
    assert decide_flow(engine, flow_input(ids["good"], "acme/db", 5432)).allow
    assert decide_flow(engine, flow_input("acme/web", "platform/dns", 53, "udp")).allow
    assert not decide_flow(engine, flow_input("evil/bot", "platform/dns", 53, "udp")).allow
    d = decide_grant_request(engine, data, {
        "requester": {"tenant": "globex"}, "src": {"tenant": "globex", "group": "api"},
        "dst": {"tenant": "acme", "group": "db"}, "proto": "tcp", "ports": [5432], "ttl_seconds": 3600})
    assert (d.outcome, d.approvers) == ("pending", ["security", "tenant-admin:acme"])
    # a new grant reaches the engine incrementally through decide_grant_request's data argument
    with db.session() as s:
        add_grant(s, "fresh", ("globex", "api"), ("acme", "db"), [5432], NOW)
    with db.read_session() as s:
        data2 = build_data(s, NOW)
    decide_grant_request(engine, data2, {"requester": {"tenant": "acme"}})
    assert decide_flow(engine, flow_input("globex/api", "acme/db", 5432)).allow


def test_naive_now_is_rejected(db: Database) -> None:
    with db.read_session() as s, pytest.raises(InvalidInput):
        build_data(s, datetime(2026, 1, 1))


@pytest.mark.parametrize("text", ["acme", "a/b/c", "spiffe://td/ns/x", "Acme/web", "spiffe://td/tenant/a/group/",
                                  "spiffe://td/tenant/a/group/g", "spiffe://td/tenant/a/group/g/w/extra"])
def test_bad_identities_are_rejected(text: str) -> None:
    with pytest.raises(InvalidInput):
        flow_input(text, "acme/web", 443)


def test_bad_ports_and_protos_are_rejected() -> None:
    for port, proto in [(0, "tcp"), (65536, "tcp"), (443, "icmp")]:
        with pytest.raises(InvalidInput):
            flow_input("acme/web", "globex/api", port, proto)


def test_grant_ops_patch_one_grant_without_a_rebuild(db: Database) -> None:
    from policy.data import grant_ops
    from policy.decide import sync_data
    from policy.models import Grant

    with db.session() as s:
        populate(s, NOW)
    with db.read_session() as s:
        data = build_data(s, NOW)
        live = s.get(Grant, "live")
        pending = s.get(Grant, "pending")
    assert live is not None and pending is not None
    engine = RegorusEngine(shipped(), data)
    assert grant_ops(engine.data(), live, NOW) == []  # unchanged
    assert grant_ops(engine.data(), pending, NOW) == []  # not live, not present
    pending.state = "active"
    ops = grant_ops(engine.data(), pending, NOW)
    assert [o["op"] for o in ops] == ["add"]
    engine.patch_data(ops)
    assert decide_flow(engine, flow_input("globex/api", "acme/web", 443)).allow
    live.state = "revoked"
    engine.patch_data(grant_ops(engine.data(), live, NOW))
    assert not decide_flow(engine, flow_input("acme/web", "globex/api", 8443)).allow
    # the patched document equals a rebuild from the database with the same changes
    with db.session() as s:
        for g in (live, pending):
            s.merge(g)
    with db.read_session() as s:
        assert build_data(s, NOW) == engine.data()
    sync_data(engine, data)  # and back again by diff
    assert decide_flow(engine, flow_input("acme/web", "globex/api", 8443)).allow


def _orm_build(s: Any, now: datetime) -> dict[str, Any]:
    """build_data as it was before it read columns instead of ORM instances (kept verbatim as the reference)."""
    from sqlmodel import col, select

    from inventory.models import Tenant, Workload, WorkloadGroup
    from pki.models import RevokedIdentity
    from policy.data import DATA_KEY, grant_entry, grant_is_live, group_entry
    from policy.models import Grant

    tenants: dict[str, Any] = {}
    for tenant in s.exec(select(Tenant).order_by(col(Tenant.slug))).all():
        tenants[tenant.slug] = {"quarantined": bool(tenant.quarantined), "groups": {}}
    for group in s.exec(select(WorkloadGroup).order_by(col(WorkloadGroup.tenant), col(WorkloadGroup.name))).all():
        if group.tenant in tenants:
            tenants[group.tenant]["groups"][group.name] = group_entry(group)
    revoked = {w.spiffe_id: True for w in s.exec(
        select(Workload).where(col(Workload.revoked).is_(True)).order_by(col(Workload.spiffe_id))).all()}
    for row in s.exec(select(RevokedIdentity).order_by(col(RevokedIdentity.id))).all():
        if row.workload is not None:
            revoked[row.spiffe_id_prefix] = True
            continue
        tenant_entry = tenants.get(row.tenant)
        if tenant_entry is None:
            continue
        if row.group is None:
            tenant_entry["revoked"] = True
        elif row.group in tenant_entry["groups"]:
            tenant_entry["groups"][row.group]["revoked"] = True
    revoked = dict(sorted(revoked.items()))
    grants: dict[str, dict[str, dict[str, Any]]] = {}
    for grant in s.exec(select(Grant).where(col(Grant.state) == "active").order_by(col(Grant.id))).all():
        if grant_is_live(grant, now):
            grants.setdefault(grant.src_tenant, {}).setdefault(grant.dst_tenant, {})[grant.id] = grant_entry(grant)
    return {DATA_KEY: {"tenants": tenants, "grants": grants, "revoked": revoked}}


def test_build_data_from_columns_equals_the_orm_build_and_loads_no_instances(db: Database) -> None:
    """build_data reads columns, not ORM instances (a decision after every change of the policy data builds it
    again: whole Grant rows were most of that): the same document as the ORM build, byte for byte once serialised
    (key order too), over every kind of row it reads, and nothing left in the session's identity map."""
    import json

    from sqlalchemy import event
    from sqlmodel import SQLModel

    from pki.models import RevokedIdentity
    from tests.policy.dbutil import add_group, add_tenant, add_workload

    with db.session() as s:
        populate(s, NOW)
        add_tenant(s, "zeta", NOW)
        add_tenant(s, "beta", NOW)
        s.flush()
        add_group(s, "zeta", "b", [("udp", 53), ("tcp", 443), ("tcp", 80), ("tcp", 443), ("sctp", 1)], NOW,
                  labels={"z": "1", "a": "2"}, quarantined=True)
        add_group(s, "zeta", "a", [], NOW)
        add_group(s, "beta", "gone", [("tcp", 22)], NOW)
        s.flush()
        add_workload(s, "zeta", "b", "w9", NOW, revoked=True)
        for i, (tenant, group, workload) in enumerate([("beta", None, None), ("zeta", "a", None),
                                                       ("zeta", "nosuch", None), ("nosuch", None, None),
                                                       ("acme", "web", "w7")]):
            prefix = f"spiffe://td.example/tenant/{tenant}" + (f"/group/{group}" if group else "") + (
                f"/{workload}" if workload else "")
            s.add(RevokedIdentity(spiffe_id_prefix=prefix, tenant=tenant, group=group, workload=workload,
                                  reason="test", revoked_at=NOW, revoked_by=f"tester-{i}"))
        for i in range(40):  # active (live, expired, without expiry), pending, revoked, over several tenant pairs
            state = ("active", "active", "pending", "revoked", "active")[i % 5]
            expires = (timedelta(minutes=i - 10) if i % 7 else None) if state == "active" else timedelta(hours=1)
            src, dst = (("zeta", "b"), ("acme", "web")) if i % 3 else (("acme", "db"), ("zeta", "a"))
            add_grant(s, f"g{i:02d}-{'x' * (i % 4)}", src, dst, sorted({443, 80 + i, 8443 - i}, reverse=True), NOW,
                      state=state, expires_in=expires, proto=("tcp", "udp")[i % 2])
    loaded: list[object] = []

    def count(target: object, _context: object) -> None:
        loaded.append(target)

    for at in (NOW, NOW + timedelta(minutes=5), NOW + timedelta(hours=2)):
        with db.read_session() as s:
            event.listen(SQLModel, "load", count, propagate=True)
            try:
                new = build_data(s, at)
            finally:
                event.remove(SQLModel, "load", count)
            assert loaded == []  # no ORM instance loaded
            old = _orm_build(s, at)
        assert json.dumps(new) == json.dumps(old)
    assert new["tf"]["tenants"]["beta"].get("revoked") is True
    assert new["tf"]["tenants"]["zeta"]["groups"]["a"].get("revoked") is True
    with db.read_session() as s:
        live = build_data(s, NOW)["tf"]["grants"]
    assert sum(len(by_id) for by_dst in live.values() for by_id in by_dst.values()) > 5


def test_explain_refuses_a_spiffe_id_the_policy_cannot_know_rather_than_allow_a_revoked_workload(
        tmp_path: Path) -> None:
    """flows.rego withdraws a workload by its exact SPIFFE ID. Explain read any ID with the layout's first four
    segments as its tenant and group: acme/train/w2, revoked, was answered `allow` when asked with a segment more
    or in another trust domain (and that answer logged). Such an ID is now refused (400), the exact one denied."""
    from policy import service
    from tests.enforcer.stored import ADMIN, open_stack
    from workflows import security

    stack = open_stack(tmp_path / "home")
    try:
        with stack.ctx.db.session() as s:
            security.revoke_workload(s, tenant="acme", group="train", name="w2", reason="compromised", actor=ADMIN,
                                     scope_tenant=None, clock=stack.clock)
        w2 = "spiffe://example.org/tenant/acme/group/train/w2"
        with stack.ctx.db.read_session() as s:
            decision, _ = service.explain(s, w2, "acme/data", 5432, now=stack.clock())
            assert not decision.allow and decision.reasons == [f"revoked-identity: {w2} is revoked"]
            for other in (f"{w2}/x", w2.replace("example.org", "other.org")):
                with pytest.raises(InvalidInput):
                    service.explain(s, other, "acme/data", 5432, now=stack.clock())
    finally:
        stack.close()
