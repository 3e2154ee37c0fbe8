"""The redteam scenario scaled down, on both real databases: tenant acme's auto-approved grants (each a different
subset of globex/api's ports) overflow a leaf's ACL budget. The leaf is compiled to fit (enforcer.fairshare):
acme's newest grants are withheld there and named (the version's cause, one audit event, the device status, the
plan), its older ones stay, and every other tenant's change - globex's grant revoked - reaches the leaf at once.
When acme's older grants expire, the withheld ones come back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from enforcer import service
from enforcer.compiler import Budget
from enforcer.ir import DeviceRuleSet
from policy.grants import Caller, revoke_grant
from tests.enforcer.helpers import SMALL
from tests.enforcer.stored import ADMIN, Stack, open_stack
from workflows.enforcement import make_reconciler, plans

LEAF = "leaf:leaf2"  # acme/train's w2 and globex/api's a1 sit under it; acme/train's w1 is under leaf1
PORTS = list(range(8000, 8012))


def fabric() -> dict[str, Any]:
    """The golden fabric, with globex/api exposing twelve ports (so acme's grants can each take a different set)."""
    doc: dict[str, Any] = yaml.safe_load(SMALL.read_text())
    doc["groups"]["globex/api"] = {"ports": [f"tcp/{p}" for p in [*PORTS, 8443]]}
    return doc


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    s = open_stack(tmp_path / "home", url, fabric())
    yield s
    s.close()


def ports(i: int) -> list[int]:
    """Grant i's ports: one of each pair (8000|8001, 8002|8003, ...), by i's bits: several ACL entries each."""
    return [PORTS[2 * j + (i >> j & 1)] for j in range(6)]


def grants_on(rs: DeviceRuleSet) -> set[str]:
    return {r.removeprefix("grant:") for rule in rs.rules for r in rule.reasons if r.startswith("grant:")}


def explained(stack: Stack, port: int) -> tuple[bool, list[str]]:
    """(allowed, the withheld notes) of acme/train -> globex/api on tcp/`port`, as GET /v1/policy/explain adds them."""
    from policy import service as policy

    with stack.ctx.db.read_session() as s:
        decision, _ = policy.explain(s, "acme/train", "globex/api", port, now=stack.clock())
        return decision.allow, service.withheld_notes(s, "globex/api", "tcp", decision.reasons)


def withholds(stack: Stack, mark: int) -> list[Any]:
    return [e for e in stack.events("enforcer.withhold", mark) if e.object_id == LEAF]


def overflow(stack: Stack, *, spare: int | None = 12, ttls: tuple[int, int] = (3600, 3600)) -> int:
    """acme's 3 older grants published on the leaf, then (the leaf's budget set to its cost then plus `spare`; None:
    left as it is) 4 newer ones, a millisecond apart (grant ids are time-ordered to the millisecond), which overflow
    it. Returns the leaf's cost with the older grants."""
    assert stack.rec.run_once("start").error is None
    for i in range(3):
        stack.grant("acme/train", "globex/api", ports(i), ttl=ttls[0])
    assert stack.rec.run_once("older").error is None
    room = stack.desired(LEAF).cost
    if spare is not None:
        stack.rec.config = replace(stack.rec.config, budget=Budget(leaf_acl_entries=room + spare,
                                                                    acl_mode="non-atomic"))
    for i in range(3, 7):
        stack.clock.advance(timedelta(milliseconds=1))
        stack.grant("acme/train", "globex/api", ports(i), ttl=ttls[1])
    return room


def test_a_tenants_grants_overflowing_a_leaf_withhold_its_newest_flows_there_only(stack: Stack) -> None:
    assert stack.rec.run_once("start").error is None
    other = stack.grant("globex/api", "acme/train", 443)  # globex's own grant, on both leaves
    older = [stack.grant("acme/train", "globex/api", ports(i), ttl=600) for i in range(3)]
    assert stack.rec.run_once("older").error is None
    room = stack.desired(LEAF).cost
    # the leaves hold what is published now and a little more: acme's newer grants overflow leaf2
    stack.rec.config = replace(stack.rec.config, budget=Budget(leaf_acl_entries=room + 12, acl_mode="non-atomic"))
    mark = stack.size()
    newer = []
    for i in range(3, 7):  # a millisecond apart: grant ids are time-ordered to the millisecond
        stack.clock.advance(timedelta(milliseconds=1))
        newer.append(stack.grant("acme/train", "globex/api", ports(i), ttl=3600))
    out = stack.rec.run_once("newer")
    assert out.error is None and LEAF in out.published  # fitted and published, not held
    leaf = stack.desired(LEAF)
    assert leaf.cost <= room + 12
    on_leaf = grants_on(leaf)
    assert set(older) | {other} <= on_leaf  # the flows that worked keep working
    withheld = set(newer) - on_leaf
    assert withheld and withheld == set(newer[-len(withheld):])  # the newest are withheld
    [row] = out.withheld[LEAF]
    assert row["tenant"] == "acme" and row["entries"] == len(withheld)
    # elsewhere every grant is published: the NICs of both ends carry the newest too
    assert set(newer) <= grants_on(stack.desired("nic:gpu1"))
    # named: the version's cause, one audit event, the device status
    with stack.ctx.db.read_session() as s:
        cause = service.versions(s, LEAF)[0]["cause"]
        status = service.status_row(s, LEAF)
    assert cause.startswith("over budget, withheld (fair share ") and f"acme {len(withheld)} entries" in cause
    assert status["withheld"] == out.withheld[LEAF]
    [event] = withholds(stack, mark)
    assert {f.split()[0].removeprefix("grant:") for f in
                                        event.summary["withheld"][0]["flows"]} == withheld
    [publish] = [e for e in stack.events("enforcer.publish", mark) if e.object_id == LEAF]
    assert publish.summary["withheld"] == out.withheld[LEAF]
    # a tenant's explain of a flow only withheld grants allow says where it is withheld; one a kept grant allows not
    note = f"allowed by policy, withheld on {LEAF}: over budget"
    by_port = {p: {g for g, i in zip(older + newer, range(9), strict=False) if p in ports(i)} for p in PORTS}
    port = next(p for p, gs in by_port.items() if gs and gs <= withheld)
    assert explained(stack, port)[0] and note in explained(stack, port)[1]
    kept = next(p for p in PORTS if any(p in ports(i) for i in range(3)))
    assert explained(stack, kept)[0] and note not in explained(stack, kept)[1]
    # again, and from another reconciler (a replica, a restart): the same set, no second event
    assert stack.rec.run_once("again").published == {}
    replica = make_reconciler(stack.ctx)
    replica.config = stack.rec.config
    try:
        assert replica.run_once("replica").published == {}
        assert [p.summary()["withheld"] for p in plans(stack.ctx, replica) if p.device == LEAF] == [
            out.withheld[LEAF]]  # the plan shows what is withheld, though nothing changes
    finally:
        replica.close()
    assert len(withholds(stack, mark)) == 1
    # an explicit apply publishes the fitted set too (it fits): nothing is refused, nothing changes
    assert stack.rec.apply().published == {}

    # globex revokes its grant: the leaf gets it at once, acme's overflow holds nothing back
    with stack.ctx.db.session() as s:
        revoke_grant(s, other, caller=Caller("globex-admin", "tenant-admin", "globex",
                                             ADMIN.__class__("globex-admin", "tenant", "globex")),
                     reason="done", clock=stack.clock)
    out = stack.rec.run_once("revoked")
    assert out.error is None and LEAF in out.published and other not in grants_on(stack.desired(LEAF))
    assert set(older) <= grants_on(stack.desired(LEAF))

    # acme's older grants expire: the room they free brings the withheld ones back
    stack.clock.advance(timedelta(seconds=601))
    out = stack.rec.run_once("expiry")
    assert out.error is None and out.withheld == {}
    on_leaf = grants_on(stack.desired(LEAF))
    assert set(newer) <= on_leaf and not set(older) & on_leaf
    assert withholds(stack, mark)[-1].summary["withheld"] == []
    with stack.ctx.db.read_session() as s:
        assert service.status_row(s, LEAF)["withheld"] == []


def test_a_fitted_device_is_logged_once_per_change_not_on_every_run(stack: Stack,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A device that stays over its budget logged its withheld warning on every run (every poll of every
    replica); once per change now, and again when what it withholds changes."""
    overflow(stack)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if f"{LEAF} over budget, withheld" in r.getMessage()]

    with caplog.at_level("WARNING", logger="trustfabric.enforcer"):
        assert stack.rec.run_once("newer").withheld
        assert len(warned()) == 1
        for _ in range(3):
            stack.rec.run_once("poll", full=True)
        assert len(warned()) == 1  # the same withheld set: said once
        stack.clock.advance(timedelta(milliseconds=1))
        stack.grant("acme/train", "globex/api", ports(7))
        stack.rec.run_once("one more")
        assert len(warned()) == 2 and warned()[0] != warned()[1], "\n".join(warned())


def test_verify_names_flows_withheld_to_fit_the_budget_apart_from_drift(stack: Stack) -> None:
    """`enforcer verify` reported the flows a fitted leaf withholds as plain mismatches (exit 1, as if the leaf had
    drifted): each is now named as withheld, with the device, and only a flow withholding does not explain stays a
    mismatch."""
    from cli.local.enforcer import _verify
    from enforcer.fairshare import withheld_on
    from workflows.enforcement import verify_published

    overflow(stack)
    assert stack.rec.run_once("newer").withheld
    findings, mismatches = verify_published(stack.ctx, stack.rec)
    assert not findings and mismatches  # what main's verify said: mismatches, nothing more
    assert all(m.policy and not m.devices for m in mismatches)
    with stack.ctx.db.read_session() as s:
        held = service.withheld_keys(s)
    assert set(held) == {LEAF}
    compiled = stack.rec.compiled
    assert compiled is not None
    for m in mismatches:
        assert withheld_on(compiled, held, m.src, m.dst, m.proto, m.port) == [LEAF], m
        assert withheld_on(compiled, {}, m.src, m.dst, m.proto, m.port) == []  # nothing withheld: drift
    findings, drift, withheld = _verify(stack.ctx, stack.rec)
    assert not findings and not drift and [m for m, _ in withheld] == mismatches
    assert {d for _, ds in withheld for d in ds} == {LEAF}


def test_a_rollback_past_a_fitted_version_says_what_the_restored_set_withholds(stack: Stack) -> None:
    """Status (and explain) read what a device withholds from the last enforcer.withhold event: a rollback to the
    version before the fit kept showing the fit's withheld entries on a set that withholds nothing; rolled forward
    to the fitted content again, they are shown again; an apply back to the fit says nothing new."""
    overflow(stack)
    out = stack.rec.run_once("newer")
    fitted = out.published[LEAF]
    assert out.withheld[LEAF]

    def status() -> list[dict[str, Any]]:
        with stack.ctx.db.read_session() as s:
            return list(service.status_row(s, LEAF)["withheld"])

    assert status() == out.withheld[LEAF]
    with stack.ctx.db.session() as s:
        service.rollback(s, LEAF, fitted - 1, actor=ADMIN, now=stack.clock(), budget=stack.rec.config.budget)
    assert status() == []  # the restored set withholds nothing
    with stack.ctx.db.session() as s:
        service.rollback(s, LEAF, fitted, actor=ADMIN, now=stack.clock(), budget=stack.rec.config.budget)
    assert status() == out.withheld[LEAF]
    mark = stack.size()
    stack.rec.apply([LEAF])  # unpinned: the fit is the content already, nothing new to say
    assert withholds(stack, mark) == [] and status() == out.withheld[LEAF]


def test_a_budget_change_fits_the_device_again(stack: Stack) -> None:
    """The reconciler keeps a device's fit while neither its compiled set nor its published one changes; a new
    budget (the compile is redone for it, the device's compiled set stays the same) reused the fit made for the old
    one: a device left over its new budget, or withholding what the new one has room for."""
    room = overflow(stack, spare=None)
    for limit in (room + 12, room + 4, room + 20):
        stack.rec.config = replace(stack.rec.config, budget=Budget(leaf_acl_entries=limit, acl_mode="non-atomic"))
        out = stack.rec.run_once(f"limit {limit}")
        assert out.error is None and LEAF in out.withheld, limit
        assert stack.desired(LEAF).cost <= limit
        with stack.ctx.db.read_session() as s:
            assert service.status_row(s, LEAF)["withheld"] == out.withheld[LEAF]
        assert stack.rec.run_once("again").published == {}  # the fit is kept (against what it published)


def test_a_staged_plan_fits_an_overflowing_device_as_auto_mode_publishes_it(stack: Stack) -> None:
    """`enforcer plan --staged V` compiled strictly: a candidate overflowing a leaf failed (BudgetExceeded) while
    the reconciler publishes it fitted. Staged, the leaf is fitted the same way, against its published set: the
    plan has the hash the next run publishes and the same entries withheld per tenant, and publishes nothing."""
    from policy.service import active_version

    room = overflow(stack, ttls=(600, 3600))
    with stack.ctx.db.read_session() as s:
        active = active_version(s)
    assert active is not None
    before = stack.versions()
    staged = {p.device: p.summary() for p in plans(stack.ctx, stack.rec, str(active.number))}
    assert stack.versions() == before  # staged: nothing was published
    assert staged[LEAF]["withheld"][0]["tenant"] == "acme" and staged[LEAF]["budget"]["after"] <= room + 12
    assert staged == {p.device: p.summary() for p in plans(stack.ctx, stack.rec)}  # as the live plan says
    out = stack.rec.run_once("newer")
    assert out.error is None and staged[LEAF]["new_hash"] == stack.desired(LEAF).content_hash
    assert staged[LEAF]["withheld"] == out.withheld[LEAF]
