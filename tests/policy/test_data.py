"""The data document from the real database (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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


@pytest.mark.parametrize("text", ["acme", "a/b/c", "spiffe://td/ns/x", "Acme/web", "spiffe://td/tenant/a/group/"])
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
