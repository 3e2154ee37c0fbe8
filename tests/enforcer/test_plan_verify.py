"""Plans against what devices last applied, staged plans and the policy impact's per-device section for a
candidate version (nothing published), and `enforcer verify` of the published rule sets: green, and red
naming the device or the flow with both answers when a stored rule set is altered."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from audit import Actor
from enforcer import service
from enforcer.ir import DeviceRuleSet
from policy import service as policy
from tests.enforcer.helpers import modules
from tests.enforcer.stored import ADMIN, Stack
from workflows.enforcement import impact, plans, verify_published

TRAIN_TO_API = {"nic:gpu1", "nic:gpu3", "leaf:leaf1", "leaf:leaf2"}


def upload_without_platform_flows(stack: Stack) -> str:
    """A candidate version whose allowed flows leave the platform services out."""
    mods = dict(modules())
    old = "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)"
    assert old in mods["flows.rego"]
    mods["flows.rego"] = mods["flows.rego"].replace(old, "allowed_flows := array.concat(intra_tenant_flows, "
                                                         "granted_flows)")
    with stack.ctx.db.session() as s:
        v, created = policy.upload(s, policy.prepare(mods), Actor("sec", "security"), now=stack.clock())
    assert created and v.state == "candidate"
    return str(v.number)


def test_plan_is_against_what_each_device_last_applied(stack: Stack) -> None:
    stack.rec.run_once("start")
    assert plans(stack.ctx, stack.rec) == []
    stack.grant("acme/train", "globex/api", 8443)
    pending = plans(stack.ctx, stack.rec)
    assert {p.device for p in pending} == TRAIN_TO_API and all(p.added and not p.removed for p in pending)
    v1 = stack.desired("nic:gpu1").content_hash
    stack.rec.run_once("granted")
    with stack.ctx.db.session() as s:  # gpu1's agent still runs version 1
        service.record_status(s, "nic:gpu1", {"applied_version": 1, "applied_hash": v1}, actor=Actor("n", "node"),
                              now=stack.clock())
    [behind] = plans(stack.ctx, stack.rec)
    assert behind.device == "nic:gpu1" and behind.old_hash == v1 and behind.added


def test_staged_plan_and_impact_name_the_devices_a_candidate_touches_and_publish_nothing(stack: Stack) -> None:
    stack.rec.run_once("start")
    before = stack.versions()
    number = upload_without_platform_flows(stack)
    staged = plans(stack.ctx, stack.rec, number)
    platform_devices = {d for d in before if "platform-service" in {r for rule in stack.desired(d).rules
                                                                    for r in rule.reasons}}
    assert {p.device for p in staged} == platform_devices and len(platform_devices) >= 4
    assert all(p.removed and not p.added for p in staged)
    report = impact(stack.ctx, number, limit=10)
    assert report["closed_count"] > 0 and report["opened_count"] == 0
    devices = report["devices"]
    assert devices["devices"] == 6 and devices["touched"] == len(staged)
    assert {d["device"] for d in devices["by_device"]} == platform_devices
    assert all(d["rules_removed"] > 0 and d["rules_added"] == 0 for d in devices["by_device"])
    assert stack.versions() == before  # staged: nothing was published


def test_a_candidate_is_evaluated_in_the_policy_sandbox_for_staged_plans_and_impact(stack: Stack) -> None:
    """Issue 13 item 5 holds for the enforcer's reads of a candidate too: its allowed flows are user-supplied
    Rego, so a staged plan and the impact report's device section evaluate them in a limited process; one over
    the CPU budget is refused naming it, and the server never runs it."""
    from dataclasses import replace

    from policy.authoring import PreparedVersion
    from policy.errors import PolicyBudgetExceeded
    from policy.testing import TestReport
    from policy.versions import version_hash

    mods = {k: v for k, v in modules().items() if not k.endswith("_test.rego")}
    spin = "count([1 | some i in numbers.range(1, 20000); some j in numbers.range(1, 20000); i == j]) > 0"
    mods["flows.rego"] = mods["flows.rego"].replace(
        "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)",
        f"allowed_flows := intra_tenant_flows if {{ {spin} }}")
    with stack.ctx.db.session() as s:  # stored as it is (its tests are not the point): a candidate
        v, _ = policy.upload(s, PreparedVersion(mods, version_hash(mods), TestReport()), ADMIN, now=stack.clock())
    stack.ctx.settings = replace(stack.ctx.settings, policy_job_cpu_seconds=1)
    stack.rec.run_once("start")
    with pytest.raises(PolicyBudgetExceeded, match=f"the staged compile of policy version {v.number} exceeded "
                                                   "the 1 s CPU budget"):
        plans(stack.ctx, stack.rec, str(v.number))
    with pytest.raises(PolicyBudgetExceeded, match="exceeded the 1 s CPU budget"):
        impact(stack.ctx, str(v.number), limit=10)


def _alter(stack: Stack, device: str, ir: str, digest: str | None = None) -> None:
    with stack.ctx.db.session() as s:
        conn = s.connection()
        conn.execute(text("UPDATE enforcer_rulesets SET ir = :ir WHERE device = :d"), {"ir": ir, "d": device})
        if digest is not None:
            conn.execute(text("UPDATE enforcer_rulesets SET content_hash = :h WHERE device = :d"),
                         {"h": digest, "d": device})
            conn.execute(text("UPDATE enforcer_devices SET content_hash = :h WHERE device = :d"),
                         {"h": digest, "d": device})


def test_verify_is_green_and_names_what_an_altered_rule_set_gets_wrong(stack: Stack) -> None:
    stack.rec.run_once("start")
    assert verify_published(stack.ctx, stack.rec) == ([], [])
    original = stack.desired("nic:gpu2")
    # altered in place: the stored bytes no longer hash to the recorded hash
    _alter(stack, "nic:gpu2", original.canonical.decode().replace("10.1.0.21", "10.1.0.99"))
    findings, _ = verify_published(stack.ctx, stack.rec)
    assert [(f.device, "altered" in f.problem) for f in findings] == [("nic:gpu2", True)]
    # altered consistently (hash recomputed): db1's ingress allows are gone; the walk names each lost flow
    doc = original.to_dict()
    doc["rules"] = [r for r in doc["rules"] if not (r["direction"] == "ingress" and r["action"] == "allow"
                                                    and r["state"] == "new")]
    broken = DeviceRuleSet.from_dict(doc)
    _alter(stack, "nic:gpu2", broken.canonical.decode(), broken.content_hash)
    findings, mismatches = verify_published(stack.ctx, stack.rec)
    assert findings == [] and mismatches
    assert all(m.dst == "acme/data/db1" and m.policy and not m.devices for m in mismatches)
    assert any(m.src == "acme/train/w1" and m.port == 5432 and "nic:gpu2 ingress" in m.detail for m in mismatches)
    assert "policy says allow, devices deny" in str(mismatches[0])
