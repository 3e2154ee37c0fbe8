"""Fabric changes on both real databases: an import creates what is new and is idempotent; every kind of bad
input is a 4xx error naming the field and writes nothing (an import is all or nothing); tenants get their
VNI, VLAN and prefixes from the pools without clashes; every change is one audit event."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlmodel import Session, select

from audit import Actor
from audit.models import AuditEvent
from core.clock import FrozenClock
from core.errors import TrustfabricError
from core.quotas import Quotas
from enforcer.allocate import Pools
from inventory import service as inventory
from inventory.models import Tenant
from keys.store import KeyKind
from pki.service import init_trust_domain
from tests.enforcer.helpers import SMALL
from workflows import fabric
from workflows.context import AppContext
from workflows.fabric import Who

GOLDEN = SMALL.read_text()
ADMIN = Actor("ops", "admin")


@pytest.fixture
def fab(ctx: AppContext) -> Iterator[AppContext]:
    """The golden fabric imported (trust domain example.org)."""
    from datetime import UTC, datetime

    ctx.clock = FrozenClock(datetime.now(UTC))
    with ctx.db.session() as s:
        init_trust_domain(s, ctx.keystore, trust_domain="example.org", key_kind=KeyKind.EC_P256, clock=ctx.clock)
    with ctx.db.session() as s:
        fabric.import_fabric(s, who(ctx), Pools(), GOLDEN, source="small.yaml")
    yield ctx


def who(ctx: AppContext, rid: str | None = None) -> Who:
    return Who(ADMIN, ctx.clock, rid)


def snapshot(ctx: AppContext) -> dict[str, Any]:
    """Every table's rows (as text): any write shows up here."""
    out: dict[str, Any] = {}
    with ctx.db.read_session() as s:
        conn = s.connection()
        for table in sorted(inspect(ctx.db.engine).get_table_names()):
            out[table] = sorted(map(str, conn.execute(text(f'SELECT * FROM "{table}"')).all()))
    return out


def run(ctx: AppContext, fn: Callable[[Session], Any]) -> Any:
    with ctx.db.session() as s:
        return fn(s)


def test_import_creates_inventory_and_fabric_and_is_idempotent(fab: AppContext) -> None:
    with fab.db.read_session() as s:
        tenants = {t.slug: (t.l3vni, t.vlan, t.prefix, t.prefix6) for t in s.exec(select(Tenant)).all()}
        assert tenants["acme"] == (10001, 101, "10.1.0.0/16", "fd00:1::/48")
        assert len(inventory.list_workloads(s, "acme")) == 3
    before = snapshot(fab)
    again = run(fab, lambda s: fabric.import_fabric(s, who(fab), Pools(), GOLDEN))
    assert again.unchanged and again.grants_not_imported == ["g-train-api"]  # grants are requested, not imported
    assert snapshot(fab) == before
    with fab.db.read_session() as s:
        grants = s.connection().execute(text("SELECT count(*) FROM grants")).scalar_one()
        [event] = s.exec(select(AuditEvent).where(AuditEvent.action == "fabric.import")).all()
    assert grants == 0 and event.summary["changes"]["placements"]["added"]["count"] == 6
    assert event.summary["tenants_created"] == {"count": 3, "names": ["acme", "globex", "platform"]}


BAD: list[tuple[str, Callable[[Session, Who], Any], str]] = [
    ("unknown node", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w1", node="gpu9", port="pf0vf2", ipv4="10.1.0.99"),
     "placements.acme/train/w1.node: unknown node 'gpu9'"),
    ("address outside the prefix", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w1", node="gpu1", port="pf0vf2", ipv4="10.9.0.1"),
     "placements.acme/train/w1.ipv4: 10.9.0.1 is outside tenant acme's prefixes"),
    ("duplicate address", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w1", node="gpu1", port="pf0vf2", ipv4="10.1.0.21"),
     "duplicate address 10.1.0.21: already placed for acme/data/db1"),
    ("port taken", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w1", node="gpu1", port="pf0vf1", ipv4="10.1.0.99"),
     "gpu1:pf0vf1 already carries globex/batch/b1"),
    ("recabled port", lambda s, w: fabric.link(s, w, Pools(), "leaf1:swp1", "gpu2:p0"),
     "is already cabled to"),
    ("unknown device in a cable", lambda s, w: fabric.link(s, w, Pools(), "gpu9:p0", "leaf1:swp1"),
     "unknown device 'gpu9'"),
    ("bad selector", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w1", node="gpu1", port="pf0vf2", ipv4="10.1.0.99", selectors=["unix:uid:root"]),
     "placements.acme/train/w1.selectors: selector 'unix:uid:root': the value must be a numeric user id"),
    ("unregistered workload", lambda s, w: fabric.place_workload(
        s, w, Pools(), "acme/train/w9", node="gpu1", port="pf0vf2", ipv4="10.1.0.99"),
     "workload 'acme/train/w9' is not registered"),
    ("node still hosting", lambda s, w: fabric.remove_device(s, w, Pools(), "node", "gpu1"),
     "node gpu1 still carries placed workloads: acme/train/w1, globex/batch/b1"),
    ("leaf still needed", lambda s, w: fabric.remove_device(s, w, Pools(), "leaf", "leaf1"),
     "(stored): node gpu2 has no uplink cabled to a leaf"),
    ("node exists", lambda s, w: fabric.add_node(s, w, Pools(), "gpu1", ["p0"], []), "node gpu1 already exists"),
    ("uplink is a host port", lambda s, w: fabric.add_node(s, w, Pools(), "gpu9", ["p0"], ["p0"]),
     "nodes.gpu9.nic: ports ['p0'] are both uplink and host ports"),
    ("import: other trust domain", lambda s, w: fabric.import_fabric(
        s, w, Pools(), GOLDEN.replace("example.org", "evil.org")), "trust_domain: is 'evil.org'"),
    ("import: a stored tenant's VNI", lambda s, w: fabric.import_fabric(
        s, w, Pools(), GOLDEN.replace("vni: 10001", "vni: 10009")), "tenants.acme: vni 10009 differs"),
    ("import: a stored tenant's prefix", lambda s, w: fabric.import_fabric(
        s, w, Pools(), GOLDEN.replace("[10.2.0.0/16]", "[10.2.0.0/17]")),
     "tenants.globex: IPv4 prefix 10.2.0.0/17 differs from the stored 10.2.0.0/16"),
    ("import: quarantine through a file", lambda s, w: fabric.import_fabric(
        s, w, Pools(), GOLDEN.replace("globex/batch: {}", "globex/batch: {quarantined: true}")),
     "groups.globex/batch: quarantine and revocation are changed with their own commands"),
    ("import: over a tenant's quota", lambda s, w: fabric.import_fabric(
        s, Who(w.actor, w.clock, w.request_id, Quotas(workloads=3)), Pools(),
        GOLDEN.replace("  acme/train/w2:\n", "  acme/train/w2:\n  acme/train/w3:\n")),
     "quota exceeded: tenant acme holds 3 registered workloads"),  # as one by one (issue 13 item 6)
    # all or nothing: the new node, tenant and group are valid; the placement after them is not
    ("import: one bad line", lambda s, w: fabric.import_fabric(s, w, Pools(), GOLDEN.replace(
        "  gpu4: {nic:", "  gpu5: {nic: {uplinks: [p0], host_ports: [pf0vf0]}}\n  gpu4: {nic:").replace(
        "tenants:\n", "tenants:\n  initech: {}\n").replace("groups:\n", "groups:\n  initech/app: {}\n").replace(
        "ipv4: 10.0.0.53}", "ipv4: 10.0.9.300}")), "fabric.yaml:56: placements.platform/dns/ns1.ipv4: "
                                                         "'10.0.9.300' is not an IP address"),
]


def test_bad_input_names_the_field_and_writes_nothing(fab: AppContext) -> None:
    """Every case of BAD on one stored fabric (nothing is written, so each starts from the same state)."""
    before = snapshot(fab)
    problems = []
    for name, change, message in BAD:
        try:
            def bad(s: Session, change: Callable[[Session, Who], Any] = change) -> Any:
                return change(s, who(fab))

            run(fab, bad)
            problems.append(f"{name}: no error")
        except TrustfabricError as exc:
            if message not in str(exc) or not 400 <= exc.http_status < 500:
                problems.append(f"{name}: {exc.http_status} {exc}")
        if snapshot(fab) != before:
            problems.append(f"{name}: wrote something")
    assert not problems, "\n".join(problems)


def test_single_changes_each_write_one_event_with_the_request_id(fab: AppContext) -> None:
    pools = Pools()
    steps: list[tuple[str, Callable[[Session, Who], Any]]] = [
        ("fabric.node.add", lambda s, w: fabric.add_node(s, w, pools, "gpu5", ["p0"], ["pf0vf0", "pf0vf1"])),
        ("fabric.leaf.add", lambda s, w: fabric.add_switch(s, w, pools, "leaf", "leaf3", ["swp1", "swp31"])),
        ("fabric.link.add", lambda s, w: fabric.link(s, w, pools, "leaf3:swp1", "gpu5:p0")),
        ("workload.place", lambda s, w: fabric.place_workload(s, w, pools, "acme/train/w1", node="gpu5",
                                                              port="pf0vf1", ipv4="10.1.0.11", ipv6="fd00:1::11",
                                                              selectors=["unix:uid:1001", "unix:gid:50"])),
        ("workload.unplace", lambda s, w: fabric.unplace_workload(s, w, pools, "acme/train/w1")),
        ("fabric.link.remove", lambda s, w: fabric.link(s, w, pools, "gpu5:p0", "leaf3:swp1", remove=True)),
        ("fabric.node.remove", lambda s, w: fabric.remove_device(s, w, pools, "node", "gpu5")),
        ("fabric.leaf.remove", lambda s, w: fabric.remove_device(s, w, pools, "leaf", "leaf3")),
    ]
    for i, (action, step) in enumerate(steps):
        rid = f"req-{i}"
        with fab.db.read_session() as s:
            seq = s.connection().execute(text("SELECT count(*) FROM audit_events")).scalar_one()
        def act(s: Session, step: Callable[[Session, Who], Any] = step, rid: str = rid) -> Any:
            return step(s, who(fab, rid))

        run(fab, act)
        with fab.db.read_session() as s:
            events = s.exec(select(AuditEvent).where(AuditEvent.seq >= seq)).all()
        assert [(e.action, e.request_id) for e in events] == [(action, rid)], action
    placed = [e for e in run(fab, lambda s: s.exec(select(AuditEvent).where(
        AuditEvent.action == "workload.place")).all())]
    assert placed[0].tenant == "acme" and placed[0].summary["changes"]["placements"]["changed"]["count"] == 1
    # a change to nothing is refused: no event for a request that changes nothing
    def back(s: Session) -> Any:
        return fabric.place_workload(s, who(fab), pools, "acme/train/w1", node="gpu1", port="pf0vf0",
                                     ipv4="10.1.0.11", ipv6="fd00:1::11")

    run(fab, back)
    with pytest.raises(TrustfabricError, match="nothing to change"):
        run(fab, back)


def test_a_moved_placement_keeps_its_selectors_where_the_node_agent_reads_them(fab: AppContext) -> None:
    from inventory.fabric import placements_on

    run(fab, lambda s: fabric.place_workload(s, who(fab), Pools(), "acme/train/w1", node="gpu2", port="pf0vf1",
                                             ipv4="10.1.0.11", selectors=["unix:uid:1001", "unix:uid:1001"]))
    with fab.db.read_session() as s:
        assert placements_on(s, "gpu1") == [("globex/batch/b1", ("gpu1", "pf0vf1", "10.2.0.21", None, ()))]
        assert dict(placements_on(s, "gpu2"))["acme/train/w1"] == ("gpu2", "pf0vf1", "10.1.0.11", None,
                                                                   ("unix:uid:1001",))


def test_tenants_get_vni_vlan_and_prefix_from_the_pools_without_clashes(fab: AppContext) -> None:
    pools = Pools(vni=(10_001, 10_010), vlan=(101, 110), ipv4="10.0.0.0/14", ipv4_len=16, ipv6="fd00::/32")
    t = run(fab, lambda s: fabric.create_tenant(s, who(fab), pools, slug="initech", display_name="Initech"))
    # 10001/101 and 10.0-10.2 are taken by the golden tenants; fd00:1::/48 by acme
    assert (t.l3vni, t.vlan, t.prefix, t.prefix6) == (10003, 103, "10.3.0.0/16", "fd00::/48")
    before = snapshot(fab)
    for kwargs, message in (({"prefix": "10.1.128.0/17"}, "overlaps acme's 10.1.0.0/16"),
                            ({"l3vni": 10002}, "both use VNI 10002"), ({"vlan": 103}, "both use VLAN 103"),
                            ({"prefix": "10.9.0.0/16", "prefix6": "10.8.0.0/16"}, "at most one IPv4")):
        with pytest.raises(TrustfabricError, match=message):
            def create(s: Session, kw: dict[str, Any] = kwargs) -> Any:
                return fabric.create_tenant(s, who(fab), pools, slug="evil", display_name="E", **kw)

            run(fab, create)
    assert snapshot(fab) == before
    full = Pools(vni=(10_001, 10_003))
    with pytest.raises(TrustfabricError, match=r"VNI pool .* is exhausted"):
        run(fab, lambda s: fabric.create_tenant(s, who(fab), full, slug="late", display_name="L"))


def test_a_tenant_made_before_the_fabric_gets_its_vlan_when_first_placed(fab: AppContext) -> None:
    with fab.db.session() as s:  # as tenants were created before schema step 10: no VLAN, no prefix
        inventory.create_tenant(s, slug="legacy", display_name="Legacy", l3vni=42, actor=ADMIN)
        inventory.create_group(s, tenant="legacy", name="app", actor=ADMIN)
        inventory.register_workload(s, trust_domain="example.org", tenant="legacy", group="app", name="a1",
                                    actor=ADMIN)
    out = run(fab, lambda s: fabric.place_workload(s, who(fab), Pools(), "legacy/app/a1", node="gpu2",
                                                   port="pf0vf2", ipv4="10.3.0.5"))
    assert out.tenants_allocated == ["legacy"]
    with fab.db.read_session() as s:
        t = s.get(Tenant, "legacy")
        events = s.exec(select(AuditEvent).where(AuditEvent.action == "tenant.allocate")).all()
    assert t is not None and (t.l3vni, t.vlan, t.prefix) == (42, 103, "10.3.0.0/20")
    assert [e.object_id for e in events] == ["legacy"] and events[0].summary == {"vlan": 103, "prefix": "10.3.0.0/20"}


def test_an_import_fills_what_a_stored_tenant_lacks_and_keeps_what_it_has(ctx: AppContext) -> None:
    """The README's tour: acme and globex made by hand (VNI, VLAN, IPv4 prefix), then the golden file, which
    also gives acme an IPv6 prefix."""
    from datetime import UTC, datetime

    ctx.clock = FrozenClock(datetime.now(UTC))
    with ctx.db.session() as s:
        init_trust_domain(s, ctx.keystore, trust_domain="example.org", key_kind=KeyKind.EC_P256, clock=ctx.clock)
    for slug, vni, vlan, prefix in (("acme", 10001, 101, "10.1.0.0/16"), ("globex", 10002, 102, "10.2.0.0/16")):
        def create(s: Session, a: tuple[str, int, int, str] = (slug, vni, vlan, prefix)) -> Any:
            return fabric.create_tenant(s, who(ctx), Pools(), slug=a[0], display_name=a[0], l3vni=a[1], vlan=a[2],
                                        prefix=a[3])

        run(ctx, create)
    out = run(ctx, lambda s: fabric.import_fabric(s, who(ctx), Pools(), GOLDEN))
    assert out.tenants_created == ["platform"] and out.tenants_allocated == ["acme"]
    with ctx.db.read_session() as s:
        acme = s.get(Tenant, "acme")
    assert acme is not None and (acme.l3vni, acme.vlan, acme.prefix, acme.prefix6) == (
        10001, 101, "10.1.0.0/16", "fd00:1::/48")


@pytest.mark.parametrize(("a", "b", "message"), [
    ("leaf1:swp9", "gpu4:p0", "link leaf1:swp9 - gpu4:p0: leaf leaf1 has no port 'swp9'"),
    ("gpu9:p0", "leaf1:swp1", "link gpu9:p0 - leaf1:swp1: unknown device 'gpu9'"),
])
def test_a_refused_cable_is_named_by_its_ends(fab: AppContext, a: str, b: str, message: str) -> None:
    """Not by its place in the stored list merged with it (`request: links.6.0: ...`), which no operator sees."""
    with pytest.raises(TrustfabricError) as refused:
        run(fab, lambda s: fabric.link(s, who(fab), Pools(), a, b))
    assert str(refused.value).startswith(message), str(refused.value)
    assert 400 <= refused.value.http_status < 500
