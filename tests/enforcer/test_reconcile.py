"""The reconciler on both real databases: desired rule sets from the fabric, the active policy and the data;
published only where they change, each publication audited; triggers (grant approval and expiry, quarantine,
workload revocation, placement changes, changes committed by another process); manual mode, rollback and
pins; a publisher never overwrites a newer state with an older compile; fail safe."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import Session

from audit import Actor
from core.errors import InvalidInput
from enforcer import service
from enforcer.compiler import Budget, compile_fabric
from enforcer.fabric_db import compile_fabric_of
from enforcer.ir import DeviceRuleSet
from policy.engines import PolicyEngine
from policy.grants import Caller, revoke_grant
from tests.enforcer.stored import ADMIN, TD, Stack, addresses, open_stack, with_mode
from workflows import security
from workflows.context import AppContext
from workflows.fabric import import_fabric, place_workload, remove_device, unplace_workload

DEVICES = {"nic:gpu1", "nic:gpu2", "nic:gpu3", "nic:gpu4", "leaf:leaf1", "leaf:leaf2"}
# acme/train (w1 on gpu1 under leaf1, w2 on gpu3 under leaf2) -> globex/api (a1 on gpu3 under leaf2)
TRAIN_TO_API = {"nic:gpu1", "nic:gpu3", "leaf:leaf1", "leaf:leaf2"}


def all_reasons(rs: DeviceRuleSet) -> set[str]:
    return {r for rule in rs.rules for r in rule.reasons} | {
        r for v in rs.vrfs for lk in v.leaks for r in lk.reasons}


def changed(before: dict[str, tuple[int, str | None]], after: dict[str, tuple[int, str | None]]) -> set[str]:
    return {d for d in after if before.get(d) != after[d]}


def started(stack: Stack) -> dict[str, tuple[int, str | None]]:
    out = stack.rec.run_once("test start")
    assert out.error is None and set(out.published) == DEVICES
    return stack.versions()


def test_first_run_publishes_every_device_once_with_its_audit_event(stack: Stack) -> None:
    out = stack.rec.run_once("first")
    assert out.full and out.published == dict.fromkeys(DEVICES, 1)
    events = stack.events("enforcer.publish")
    assert sorted(e.object_id for e in events) == sorted(DEVICES)
    for e in events:
        assert e.summary["version"] == 1 and e.summary["new_hash"] == stack.desired(e.object_id).content_hash
        assert e.summary["old_hash"] is None and e.summary["rules_added"] > 0 and e.reason == "first"
    again = stack.rec.run_once("again")
    assert again.published == {} and not again.full and stack.rec.due() is None
    assert len(stack.events("enforcer.publish")) == len(DEVICES)


def test_a_grant_approval_publishes_exactly_the_touched_devices(stack: Stack) -> None:
    before = started(stack)
    mark = stack.size()
    gid = stack.grant("acme/train", "globex/api", 8443)
    due = stack.rec.due()
    assert due is not None and f"grant.approve {gid}" in due
    out = stack.rec.run_once("test")
    assert not out.full and set(out.published) == TRAIN_TO_API == changed(before, stack.versions())
    carrying = {d for d in DEVICES if f"grant:{gid}" in all_reasons(stack.desired(d))}
    assert carrying == TRAIN_TO_API  # the devices that changed are exactly the ones the grant reaches
    published = stack.events("enforcer.publish", mark)
    assert sorted(e.object_id for e in published) == sorted(TRAIN_TO_API)
    assert all(e.summary["version"] == 2 and e.summary["rules_added"] > 0 and gid in (e.reason or "")
               for e in published)


def test_the_look_after_a_write_is_one_statement(stack: Stack) -> None:
    """due() runs on every replica after every write (issue 11): one statement, no transaction around it, and
    what it reads is the same answer a transaction's two reads gave."""
    from tests.roundtrips import watch

    started(stack)
    with watch(stack.ctx.db.engine) as sent:
        for _ in range(6):  # the first rounds warm the pool's traced connections
            sent.next_round()
            gid = stack.grant("acme/train", "globex/api", 8443)
            sent.next_round()
            due = stack.rec.due()
            assert due is not None and f"grant.approve {gid}" in due
            sent.next_round()
            stack.rec.run_once("test")
    looks = sent.rounds[2::3][2:]
    assert looks and all(len(r) == 1 for r in looks), looks


def test_grant_expiry_withdraws_its_flows_when_it_expires(stack: Stack) -> None:
    started(stack)
    gid = stack.grant("acme/train", "globex/api", 8443, ttl=600)
    stack.rec.run_once("approved")
    granted = stack.versions()
    stack.clock.advance(timedelta(seconds=599))
    assert stack.rec.due() is None
    stack.clock.advance(timedelta(seconds=2))
    assert stack.rec.due() == "grant expiry"  # no row changed: the reconciler knew when to look
    out = stack.rec.run_once("expiry")
    assert set(out.published) == TRAIN_TO_API == changed(granted, stack.versions())
    assert not any(f"grant:{gid}" in all_reasons(stack.desired(d)) for d in DEVICES)


def test_quarantine_withdraws_the_tenants_flows_and_lifting_it_restores_the_same_rule_sets(stack: Stack) -> None:
    before = started(stack)
    globex = {"10.2.0.11/32", "10.2.0.21/32"}
    assert any(globex & addresses(stack.desired(d)) for d in DEVICES)
    with stack.ctx.db.session() as s:
        security.set_quarantine(s, tenant="globex", group=None, quarantined=True, actor=ADMIN, reason="incident")
    out = stack.rec.run_once("quarantine")
    assert out.published and not any(globex & addresses(stack.desired(d)) for d in DEVICES)
    acme_data = stack.desired("nic:gpu2")  # acme/data's db1: its intra-tenant allows stay
    assert "intra-tenant" in all_reasons(acme_data)
    with stack.ctx.db.session() as s:
        security.set_quarantine(s, tenant="globex", group=None, quarantined=False, actor=ADMIN, reason="over")
    stack.rec.run_once("lifted")
    assert {d: h for d, (_v, h) in stack.versions().items()} == {d: h for d, (_v, h) in before.items()}


def test_revoking_a_workload_withdraws_its_flows(stack: Stack) -> None:
    started(stack)
    with stack.ctx.db.session() as s:
        security.revoke_workload(s, tenant="acme", group="train", name="w2", reason="compromised", actor=ADMIN,
                                 scope_tenant=None, clock=stack.clock)
    out = stack.rec.run_once("revoked")
    assert out.published and not out.full  # a revocation is incremental: the fabric did not change
    assert not any("10.1.0.12/32" in addresses(stack.desired(d)) for d in DEVICES)
    assert "10.1.0.11/32" in addresses(stack.desired("nic:gpu2"))  # w1 still reaches acme/data


def test_a_placement_change_republishes_exactly_the_devices_it_changes(stack: Stack) -> None:
    before = started(stack)
    with stack.ctx.db.session() as s:
        place_workload(s, stack.who, stack.ctx.settings.pools(), "acme/train/w2", node="gpu4", port="pf0vf1",
                       ipv4="10.1.0.12")
    out = stack.rec.run_once("moved")
    assert out.full  # the fabric changed
    # the oracle: a compile from scratch of what is stored now, against what was published before
    _compiled, inputs = stack.rec.compile_now()
    fresh = compile_fabric(inputs.fabric, inputs.allowed, inputs.revoked)
    expect = {d for d, rs in fresh.devices.items() if rs.content_hash != before[d][1]}
    assert set(out.published) == expect == changed(before, stack.versions())
    # both nodes sit under leaf2; rules elsewhere name the whole acme/train set, whose addresses did not change
    assert expect == {"nic:gpu3", "nic:gpu4", "leaf:leaf2"}
    assert sorted(p.workload for p in stack.desired("nic:gpu4").ports) == ["acme/train/w2", "platform/dns/ns1"]
    assert "acme/train/w2" not in [p.workload for p in stack.desired("nic:gpu3").ports]


def test_a_device_that_leaves_the_fabric_is_retired(stack: Stack) -> None:
    started(stack)
    pools = stack.ctx.settings.pools()
    with stack.ctx.db.session() as s:
        unplace_workload(s, stack.who, pools, "platform/dns/ns1")
    with stack.ctx.db.session() as s:
        remove_device(s, stack.who, pools, "node", "gpu4")
    out = stack.rec.run_once("removed")
    assert out.retired == ["nic:gpu4"] and "nic:gpu4" not in stack.versions()
    assert [e.object_id for e in stack.events("enforcer.retire")] == ["nic:gpu4"]
    with stack.ctx.db.read_session() as s:  # out of the desired state: verify, plan and the agents skip it
        assert "nic:gpu4" not in service.desired(s) and not service.get_state(s, "nic:gpu4").in_fabric


def test_changes_of_another_process_are_polled_and_irrelevant_events_are_skipped(stack: Stack) -> None:
    started(stack)
    other = AppContext.open(stack.ctx.settings, clock=stack.clock)  # its own engine and connections
    try:
        from pki.service import issue_x509_svid
        from tests.pki.helpers import make_csr

        with other.db.session() as s:  # credentials do not change any rule set
            issue_x509_svid(s, other.keystore, csr_pem=make_csr(), tenant="acme", group="train", workload="w1",
                            ttl=None, actor=Actor.system("t"), scope_tenant=None, clock=stack.clock)
        assert stack.rec.due() is None
        with other.db.session() as s:
            security.set_quarantine(s, tenant="acme", group="data", quarantined=True, actor=ADMIN, reason="x")
    finally:
        other.close()
    due = stack.rec.due()
    assert due is not None and "group.quarantine acme/data" in due
    assert stack.rec.run_once(due).published


def test_a_publisher_never_overwrites_a_newer_state_with_an_older_compile(stack: Stack) -> None:
    started(stack)
    gid = stack.grant("acme/train", "globex/api", 8443)
    real = stack.rec._compile
    calls: list[int] = []

    def compile_then_someone_revokes(inputs, full):  # type: ignore[no-untyped-def]
        calls.append(1)
        out = real(inputs, full)
        if len(calls) == 1:  # committed after the inputs were read, before the publication
            with stack.ctx.db.session() as s:
                revoke_grant(s, gid, caller=Caller("sec", "security", None, Actor("sec", "security")),
                             reason="changed my mind", clock=stack.clock)
        return out

    stack.rec._compile = compile_then_someone_revokes  # type: ignore[method-assign]
    out = stack.rec.run_once("race")
    assert len(calls) == 2 and out.error is None
    assert not any(f"grant:{gid}" in all_reasons(stack.desired(d)) for d in DEVICES)  # the older compile never won


def test_manual_mode_holds_a_pending_plan_until_apply(stack: Stack) -> None:
    before = started(stack)
    with_mode(stack, "manual")
    mark = stack.size()
    stack.grant("acme/train", "globex/api", 8443)
    out = stack.rec.run_once("held")
    assert out.published == {} and set(out.held) == TRAIN_TO_API and stack.versions() == before
    with stack.ctx.db.read_session() as s:
        assert {d for d, st in service.states(s).items() if st.pending_hash} == TRAIN_TO_API
    assert sorted(e.object_id for e in stack.events("enforcer.hold", mark)) == sorted(TRAIN_TO_API)
    one = stack.rec.apply(["nic:gpu1"])
    assert one.published == {"nic:gpu1": 2}
    rest = stack.rec.apply()
    assert set(rest.published) == TRAIN_TO_API - {"nic:gpu1"}
    with stack.ctx.db.read_session() as s:
        assert not any(st.pending_hash for st in service.states(s).values())


def test_rollback_pins_the_device_and_apply_unpins_it(stack: Stack) -> None:
    first = started(stack)
    stack.grant("acme/train", "globex/api", 8443)
    stack.rec.run_once("granted")
    budget = stack.rec.config.budget
    with stack.ctx.db.session() as s:
        row = service.rollback(s, "nic:gpu1", 1, actor=ADMIN, now=stack.clock(), budget=budget, reason="bad push")
    assert (row.version, row.content_hash) == (3, first["nic:gpu1"][1])
    [event] = stack.events("enforcer.rollback")
    assert event.object_id == "nic:gpu1" and event.summary["pinned"] is True and "bad push" in (event.reason or "")
    with stack.ctx.db.session() as s, pytest.raises(InvalidInput, match="earlier version"):
        service.rollback(s, "nic:gpu1", 3, actor=ADMIN, now=stack.clock(), budget=budget)
    with stack.ctx.db.session() as s:  # w1 (on gpu1) loses its flows to acme/data
        security.set_quarantine(s, tenant="acme", group="data", quarantined=True, actor=ADMIN, reason="x")
    out = stack.rec.run_once("quarantined")
    assert "nic:gpu1" not in out.published and out.held == ["nic:gpu1"]  # auto mode leaves the pin alone
    assert out.published and stack.versions()["nic:gpu1"] == (3, first["nic:gpu1"][1])
    applied = stack.rec.apply(["nic:gpu1"])
    assert applied.published == {"nic:gpu1": 4}
    with stack.ctx.db.read_session() as s:
        st = service.get_state(s, "nic:gpu1")
    assert not st.pinned and st.pending_hash is None and st.content_hash != first["nic:gpu1"][1]
    # unpinned: the next change reaches it again
    with stack.ctx.db.session() as s:
        security.set_quarantine(s, tenant="acme", group="data", quarantined=False, actor=ADMIN, reason="x")
    assert "nic:gpu1" in stack.rec.run_once("lifted").published


def test_no_active_policy_publishes_default_deny_and_an_overflow_holds_back_its_devices(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = open_stack(tmp_path / "home")
    try:
        with s.ctx.db.session() as session:
            session.connection().execute(text("UPDATE policy_versions SET state = 'retired'"))
        out = s.rec.run_once("no policy")
        assert set(out.published) == DEVICES
        for d in DEVICES:  # only conntrack return and the final denies: nothing new is allowed anywhere
            assert {r.action for r in s.desired(d).rules if r.state != "established"} == {"deny"}
        before = s.versions()
        s.rec.config = type(s.rec.config)(budget=Budget(nic_flows=5))
        with s.ctx.db.session() as session:
            session.connection().execute(text("UPDATE policy_versions SET state = 'active'"))
        over = s.rec.run_once("over budget")
        assert over.error is not None and "budget" in over.error
        nics = {d for d in DEVICES if d.startswith("nic:")}
        assert set(over.published) == DEVICES - nics  # the leaves fit: they are published
        after = s.versions()
        assert {d: after[d] for d in nics} == {d: before[d] for d in nics}  # each NIC keeps its last good set
    finally:
        s.close()


def test_a_device_over_budget_holds_back_only_itself(stack: Stack) -> None:
    """A leaf over its ACL budget that withholding cannot make fit (its skeleton and platform service alone
    exceed it: enforcer.fairshare) keeps its last good rule set, and every other device still gets the new
    compile: a workload revoked meanwhile is withdrawn from them. Before, one device over budget published nothing
    anywhere, so the revoked workload stayed admitted on every device for as long as the overflow lasted."""
    from enforcer.fairshare import _assemble, _touching, owner

    before = started(stack)
    b1 = "10.2.0.21/32"  # globex/batch/b1 on gpu1
    nics = {d for d in DEVICES if d.startswith("nic:")}
    assert any(b1 in addresses(stack.desired(d)) for d in nics)
    stack.grant("acme/train", "globex/api", 8443)
    with stack.ctx.db.session() as s:
        security.revoke_workload(s, tenant="globex", group="batch", name="b1", reason="compromised", actor=ADMIN,
                                 scope_tenant=None, clock=stack.clock)
    compiled, _ = stack.rec.compile_now()  # publishes nothing: the next run still sees both changes
    fixed = {d: _assemble(compiled, d, [e for e in _touching(compiled, d) if owner(e) is None]).cost
             for d, rs in compiled.devices.items() if rs.kind == "leaf"}
    limit = max(fixed.values()) - 1
    over = {d for d, cost in fixed.items() if cost > limit}
    stack.rec.config = replace(stack.rec.config, budget=Budget(leaf_acl_entries=limit, acl_mode="non-atomic"))
    out = stack.rec.run_once("revoked")
    assert out.error is not None and "budget" in out.error and all(d in out.error for d in over)
    versions = stack.versions()
    assert all(versions[d] == before[d] for d in over)  # the last good set stays on the overflowing leaf
    assert "nic:gpu1" in out.published  # b1's own NIC, over budget nowhere
    for d in DEVICES - over:
        assert b1 not in addresses(stack.desired(d)), d
    assert stack.rec.run_once("again").published == {}  # nothing is published twice; the leaf still waits
    with pytest.raises(InvalidInput, match="budget"):  # an operator's apply of every device: all or nothing
        stack.rec.apply()
    assert stack.versions() == versions


def test_a_device_over_budget_is_held_visibly_audited_once_and_published_once_back_under(stack: Stack) -> None:
    """The overflowing leaf (one withholding cannot make fit) kept its last good set with no trace but a log line:
    `enforcer status` said it was in step (no pending plan) while it lacked a revocation. It is now held: its
    compile is its pending plan, one `enforcer.hold` event says why (not one per run), and once the budget fits
    again the same run publishes it."""
    from enforcer.fairshare import _assemble, _touching, owner

    before = started(stack)
    stack.grant("acme/train", "globex/api", 8443)
    compiled, _ = stack.rec.compile_now()
    # over even when fitted: the skeleton and shared entries alone exceed the limit (enforcer.fairshare)
    fixed = {d: _assemble(compiled, d, [e for e in _touching(compiled, d) if owner(e) is None]).cost
             for d, rs in compiled.devices.items() if rs.kind == "leaf"}
    over = {d for d, cost in fixed.items() if cost == max(fixed.values())}
    budget = stack.rec.config.budget
    stack.rec.config = replace(stack.rec.config, budget=Budget(leaf_acl_entries=max(fixed.values()) - 1,
                                                                acl_mode="non-atomic"))
    mark = stack.size()
    out = stack.rec.run_once("grant")
    assert over <= set(out.held) and not over & set(out.published)
    with stack.ctx.db.read_session() as s:
        rows = {d: service.status_row(s, d) for d in over}
    assert all(r["pending_hash"] == compiled.devices[d].content_hash and r["desired_version"] == before[d][0]
               for d, r in rows.items()), rows
    held = [e for e in stack.events("enforcer.hold", mark) if e.object_id in over]
    assert sorted(e.object_id for e in held) == sorted(over)
    assert all("over budget" in e.summary["why"] for e in held)
    stack.rec.run_once("again")
    stack.rec.run_once("periodic resync", full=True)
    assert len([e for e in stack.events("enforcer.hold", mark) if e.object_id in over]) == len(over)  # once
    stack.rec.config = replace(stack.rec.config, budget=budget)
    back = stack.rec.run_once("budget raised")
    assert over <= set(back.published)
    with stack.ctx.db.read_session() as s:
        assert not any(service.status_row(s, d)["pending_hash"] for d in over)


def test_the_stored_fabric_compiles_like_the_golden_file(stack: Stack) -> None:
    """What the database holds after an import is the golden fabric (its compile-relevant part)."""
    from tests.enforcer.helpers import small

    with stack.ctx.db.read_session() as s:
        stored = compile_fabric_of(s, TD)
    golden = small()
    assert stored.nodes == golden.nodes and stored.switches == golden.switches and stored.links == golden.links
    assert stored.placements == golden.placements and stored.tenants == golden.tenants


def test_what_the_reconciler_keeps_between_runs_equals_a_fresh_read(stack: Stack,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After grant events the data is patched, not rebuilt; after events that leave the fabric it is not read
    again: both must be exactly what a fresh read gives."""
    from enforcer import reconcile
    from policy.data import build_data

    started(stack)
    builds: list[int] = []

    def counted_build(session: Session, now: datetime) -> dict[str, Any]:
        builds.append(1)
        return build_data(session, now)

    monkeypatch.setattr(reconcile, "build_data", counted_build)
    fabric = stack.rec._fabric
    gid = stack.grant("acme/train", "globex/api", 8443)
    stack.grant("acme/data", "globex/api", 8443)
    stack.rec.run_once("grants")
    engine = stack.rec._engine
    assert engine is not None and stack.rec._fabric is fabric and builds == []  # patched, not rebuilt
    with stack.ctx.db.read_session() as s:
        assert engine.data() == build_data(s, stack.clock())
    with stack.ctx.db.session() as s:
        revoke_grant(s, gid, caller=Caller("sec", "security", None, Actor("sec", "security")), reason="x",
                     clock=stack.clock)
    stack.rec.run_once("revoked")
    with stack.ctx.db.read_session() as s:
        assert engine.data() == build_data(s, stack.clock()) and builds == []
        assert stack.rec._fabric is fabric and compile_fabric_of(s, TD) == fabric
    with stack.ctx.db.session() as s:
        place_workload(s, stack.who, stack.ctx.settings.pools(), "acme/train/w2", node="gpu4", port="pf0vf1",
                       ipv4="10.1.0.12")
    stack.rec.run_once("moved")
    with stack.ctx.db.read_session() as s:
        assert stack.rec._fabric is not fabric and stack.rec._fabric == compile_fabric_of(s, TD) and builds == [1]


def test_without_devices_a_grant_costs_no_evaluation_and_the_first_device_gets_every_grant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A control plane with no enforced device (the replicas serving grant requests before a fabric is
    imported) neither reads the policy data nor evaluates after a grant; when devices appear, their first
    rule sets carry the grants approved meanwhile (the engine's document is rebuilt, not patched)."""
    import yaml

    from enforcer import reconcile
    from policy.data import build_data
    from tests.enforcer.helpers import SMALL

    full = yaml.safe_load(SMALL.read_text())
    bare = {k: full[k] for k in ("trust_domain", "tenants", "groups", "workloads")}
    s = open_stack(tmp_path / "home", fabric=bare)
    try:
        first = s.rec.run_once("start")
        assert first.error is None and first.published == {}
        builds: list[int] = []

        def counted_build(session: Session, now: datetime) -> dict[str, Any]:
            builds.append(1)
            return build_data(session, now)

        monkeypatch.setattr(reconcile, "build_data", counted_build)
        evaluations: list[int] = []
        allowed = s.rec._allowed

        def counted_allowed(engine: PolicyEngine | None, digest: str | None, now: datetime) -> Any:
            evaluations.append(1)
            return allowed(engine, digest, now)

        monkeypatch.setattr(s.rec, "_allowed", counted_allowed)
        gid = s.grant("acme/train", "globex/api", 8443)
        assert s.rec.due() is None  # a grant cannot give a device-less fabric a device: no run is due
        idle = s.rec.run_once("grant")  # and a run anyway (a resync, a CLI) reads and compiles nothing
        assert idle.error is None and idle.published == {} and s.rec.due() is None
        assert builds == [] and evaluations == []  # nothing read or evaluated for no device
        s.rec.wake(fabric=False)  # a grant request's write: no look is taken while idle
        assert not s.rec._wake.is_set()
        s.rec.wake()  # any other write (it may import the fabric): a look at once
        assert s.rec._wake.is_set()
        with s.ctx.db.session() as session:
            import_fabric(session, s.who, s.ctx.settings.pools(), SMALL.read_text(), source="small.yaml")
        out = s.rec.run_once("devices")
        assert out.error is None and set(out.published) == DEVICES and builds == [1] and evaluations == [1]
        carrying = {d for d in DEVICES if f"grant:{gid}" in all_reasons(s.desired(d))}
        assert carrying == TRAIN_TO_API
    finally:
        s.close()
