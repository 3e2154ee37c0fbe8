"""The compiler: determinism, budgets, and the lifecycle events that must withdraw exactly the right flows."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from enforcer.compiler import Budget, compile_fabric, contributors, recompile
from enforcer.equivalence import verify
from enforcer.errors import BudgetExceeded
from enforcer.fabric import Fabric, revoked_ids
from enforcer.plan import plan
from policy.decide import expand_allowed
from tests.enforcer.gen import fabrics
from tests.enforcer.helpers import NOW_NS, allowed_flows, compile_small, small


def _shuffled(fabric: Fabric, rng: random.Random) -> Fabric:
    def mix(xs: tuple[Any, ...]) -> tuple[Any, ...]:
        ys = list(xs)
        rng.shuffle(ys)
        return tuple(ys)

    return Fabric(fabric.trust_domain, mix(fabric.tenants), mix(fabric.groups), mix(fabric.workloads),
                  mix(fabric.nodes), mix(fabric.switches), mix(fabric.links), mix(fabric.placements),
                  mix(fabric.grants))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabrics())
def test_same_input_gives_byte_identical_rule_sets_whatever_the_order(fabric: Fabric) -> None:
    allowed = allowed_flows(fabric)
    a = compile_fabric(fabric, allowed, revoked_ids(fabric))
    rng = random.Random(len(fabric.placements))
    again = list(allowed)
    rng.shuffle(again)
    again = [{**e, "sources": list(reversed(e["sources"]))} for e in again]
    b = compile_fabric(_shuffled(fabric, rng), again, sorted(revoked_ids(fabric), reverse=True))
    assert {d: rs.canonical for d, rs in a.devices.items()} == {d: rs.canonical for d, rs in b.devices.items()}


def test_malformed_allowed_flows_is_bad_input() -> None:
    f = small()
    with pytest.raises(InvalidInput, match="malformed entry"):
        compile_fabric(f, [{"dst_tenant": "acme", "dst_group": "train", "proto": "tcp", "ports": ["x"],
                            "reason": "r", "sources": []}])
    with pytest.raises(InvalidInput, match="undefined"):
        compile_fabric(f, None)


def _reasons_removed(old: Any, new: Any) -> set[str]:
    changes = plan(old.devices, new.devices)
    assert all(not p.added and not p.leaks_added for p in changes)
    return {r for p in changes for rule, _, _ in p.removed for r in rule.reasons} | {
        r for p in changes for _, leak in p.leaks_removed for r in leak.reasons}


def test_grant_expiry_removes_exactly_the_grants_flows_and_leaks() -> None:
    before, _ = compile_small()
    expires = before.fabric.grants[0].expires_at
    after_ns = int(expires.timestamp()) * 10**9 + 1
    after, allowed = compile_small(now_ns=after_ns)
    assert _reasons_removed(before, after) == {"grant:g-train-api"}
    assert all("grant:g-train-api" not in r.reasons for rs in after.devices.values() for r in rs.rules)
    assert verify(after, allowed, exhaustive=True) == []


def _without(compiled: Any, gone: set[str]) -> set[Any]:
    """Every rule and leak with the `gone` addresses taken out of its sets (rules left empty vanish)."""
    out: set[Any] = set()
    for d, rs in compiled.devices.items():
        sets = rs.set_by_name
        for r in rs.rules:
            src = set(sets[r.src].v4 + sets[r.src].v6) if r.src in sets else {"*"}
            dst = set(sets[r.dst].v4 + sets[r.dst].v6) if r.dst in sets else {"*"}
            if src - gone and dst - gone:
                out.add((d, r, frozenset(src - gone), frozenset(dst - gone)))
        out |= {(d, v.name, lk.prefix, lk.from_vrf) for v in rs.vrfs for lk in v.leaks if lk.prefix not in gone}
    return out


def test_quarantine_removes_exactly_the_groups_flows() -> None:
    before, _ = compile_small()
    f = small()
    q = dataclasses.replace(f, groups=tuple(dataclasses.replace(g, quarantined=g.key == "globex/api")
                                            for g in f.groups))
    after, allowed = compile_small(q)
    a1 = {"10.2.0.11/32"}
    kept, expected = _without(after, set()), _without(before, a1)
    assert kept <= expected  # nothing new
    # and nothing else went but a1's addresses and the return routes only a1 needed (into its VRF, on its leaf)
    assert {x[:2] for x in expected - kept} == {("leaf:leaf2", "vrf10002")}
    assert not any(a1 & set(s.v4) for rs in after.devices.values() for s in rs.sets)
    assert verify(after, allowed, exhaustive=True) == []


def test_revoking_a_workload_withdraws_its_flows_everywhere() -> None:
    before, allowed = compile_small()
    f = before.fabric
    w1 = f.workload["acme/train/w1"].spiffe_id(f.trust_domain)
    after = compile_fabric(f, allowed, {w1})
    gone = {"10.1.0.11/32", "fd00:1::11/128"}
    assert not any(gone & set(s.v4 + s.v6) for rs in after.devices.values() for s in rs.sets)
    assert any(gone & set(s.v4 + s.v6) for rs in before.devices.values() for s in rs.sets)
    assert verify(after, allowed, exhaustive=True) == []
    # w2 of the same group keeps its grant
    assert any("grant:g-train-api" in r.reasons for r in after.devices["nic:gpu3"].rules)
    # and the same through recompile (only the devices it touches)
    inc = recompile(before, allowed, {w1})
    assert {d: rs.canonical for d, rs in inc.devices.items()} == {d: rs.canonical for d, rs in after.devices.items()}
    assert "nic:gpu4" in inc.changed and "nic:gpu2" in inc.changed and "nic:gpu1" in inc.changed


def test_budget_overflow_names_the_device_and_its_largest_contributors() -> None:
    with pytest.raises(BudgetExceeded) as info:
        compile_small(budget=Budget(nic_flows=34, leaf_acl_entries=44, acl_mode="atomic"))
    msg = str(info.value)
    over = {o.device: o for o in info.value.overflows}
    assert set(over) == {"nic:gpu1", "nic:gpu3", "leaf:leaf1"}  # leaf2 needs 22: exactly fits
    assert over["leaf:leaf1"].limit == 22  # atomic mode halves the 44 entries
    # in IPv4 entries: an IPv6 entry counts two (enforcer/cost.py V6_ACL_WEIGHT)
    assert "leaf:leaf1: 27 switch ACL entries > budget 22; largest: intra-tenant (14), default-deny (6)" in msg
    assert "nic:gpu1: 44 NIC flows > budget 34; largest: intra-tenant (5)" in msg
    compile_small(budget=Budget(nic_flows=44, leaf_acl_entries=27, acl_mode="non-atomic"))  # exactly fits


def test_an_ipv6_acl_entry_counts_two_ipv4_entries_as_in_the_switch_atcam() -> None:
    from enforcer.cost import leaf_cost

    assert leaf_cost(2, 0, 3, 0, ((443, 443),)) == 6
    assert leaf_cost(0, 2, 0, 3, ((443, 443),)) == 12  # Spectrum-2+: 25,000 IPv4 or 12,500 IPv6 entries
    assert Budget().limit("leaf") == 12_500  # the documented atomic-mode IPv4 figure


def test_contributors_sum_per_reason() -> None:
    compiled, _ = compile_small()
    top = dict(contributors(compiled.devices["nic:gpu4"]))
    assert top == {"platform-service": 10, "conntrack-return": 2, "default-deny": 4}  # RoCEv2's two too


def test_incremental_recompile_after_one_grant_matches_a_full_compile() -> None:
    f = small()
    base_allowed = allowed_flows(f)
    prev = compile_fabric(f, base_allowed, revoked_ids(f))
    extra = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [5432],
             "reason": "grant:new", "sources": ["globex/batch"]}
    inc = recompile(prev, [*base_allowed, extra])
    full = compile_fabric(f, [*base_allowed, extra], revoked_ids(f))
    assert {d: rs.canonical for d, rs in inc.devices.items()} == {d: rs.canonical for d, rs in full.devices.items()}
    # globex/batch/b1 on gpu1 -> acme/data/db1 on gpu2, both under leaf1: nothing else is touched
    assert inc.recompiled == ("leaf:leaf1", "nic:gpu1", "nic:gpu2")
    assert inc.changed == inc.recompiled
    back = recompile(inc, base_allowed)
    assert back.changed == inc.recompiled
    assert {d: rs.canonical for d, rs in back.devices.items()} == {d: rs.canonical for d, rs in prev.devices.items()}
    assert verify(inc, [*base_allowed, extra], exhaustive=True) == []


def test_plan_reports_additions_and_budget_use() -> None:
    before, allowed = compile_small(now_ns=NOW_NS)
    extra = {"dst_tenant": "globex", "dst_group": "batch", "proto": "udp", "ports": [9000, 9001],
             "reason": "grant:x", "sources": ["acme/data"]}
    after = recompile(before, [*allowed, extra])
    plans = plan(before.devices, after.devices)
    assert [p.device for p in plans] == ["leaf:leaf1", "nic:gpu1", "nic:gpu2"]
    gpu2 = next(p for p in plans if p.device == "nic:gpu2")
    assert [r.reasons for r, _, _ in gpu2.added] == [("grant:x",)]
    assert gpu2.summary()["budget"] == {"before": gpu2.cost_before, "after": gpu2.cost_after, "limit": 65536}
    assert gpu2.cost_after > gpu2.cost_before


def test_rules_come_in_evaluation_order_and_addresses_collapse_like_ipaddress() -> None:
    import ipaddress

    from enforcer.context import Context as _Context
    from enforcer.ir import rule_order

    compiled, _ = compile_small()
    for rs in compiled.devices.values():
        assert list(rs.rules) == sorted(rs.rules, key=rule_order)
    ctx = _Context(compiled.fabric, frozenset())
    rng = random.Random(3)
    for _ in range(200):
        ints = [rng.randrange(0, 64) + (10 << 24) for _ in range(rng.randrange(2, 20))]
        for i in ints:
            ctx.text[(4, i)] = str(ipaddress.IPv4Address(i))
        want = tuple(str(n) for n in ipaddress.collapse_addresses(ipaddress.IPv4Network(i) for i in ints))
        assert ctx._collapse(ints, 4) == want


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabrics(), st.randoms(use_true_random=False))
def test_any_chain_of_recompiles_equals_a_full_compile(fabric: Fabric, rnd: random.Random) -> None:
    """Entries dropped, added back, changed and workloads revoked, in any order: recompile keeps up."""
    allowed = allowed_flows(fabric)
    revoked = set(revoked_ids(fabric))
    ids = sorted(fabric.spiffe_ids().values())
    state = compile_fabric(fabric, allowed, revoked)
    current = list(allowed)
    for _ in range(4):
        step = rnd.randrange(4)
        if step == 0 and current:
            current.pop(rnd.randrange(len(current)))
        elif step == 1 and allowed:
            current.append(rnd.choice(allowed))
        elif step == 2 and current:
            i = rnd.randrange(len(current))
            current[i] = {**current[i], "ports": sorted({*current[i]["ports"], rnd.randrange(1, 100)})}
        elif ids:
            revoked ^= {rnd.choice(ids)}
        state = recompile(state, current, revoked)
        full = compile_fabric(fabric, current, revoked)
        assert {d: rs.canonical for d, rs in state.devices.items()} == {
            d: rs.canonical for d, rs in full.devices.items()}


def test_canonical_bytes_are_rfc8785() -> None:
    from core.canonical import canonical_json
    from enforcer.ir import DeviceRuleSet

    compiled, _ = compile_small()
    for rs in compiled.devices.values():
        assert rs.canonical == canonical_json(rs.to_dict())
        assert DeviceRuleSet.from_dict(rs.to_dict()) == rs
    # a non-ASCII name leaves the fast path and still hashes per RFC 8785
    rs = compiled.devices["nic:gpu1"]
    strange = dataclasses.replace(rs, uplink="p0-\u00e9\u2028")
    assert strange.canonical == canonical_json(strange.to_dict())
    # so does a number json.dumps writes otherwise (1.0: RFC 8785 says 1), deep in a rule
    floaty = dataclasses.replace(rs, rules=(rs.rules[0]._replace(priority=1.0), *rs.rules[1:]))  # type: ignore[arg-type]
    assert floaty.canonical == canonical_json(floaty.to_dict()) and b'"priority":1,' in floaty.canonical


def test_the_audit_summary_of_a_plan_counts_what_the_plan_lists() -> None:
    from enforcer.plan import plan_device, summary

    before, _ = compile_small()
    f = small()
    after, _ = compile_small(dataclasses.replace(f, grants=()))
    for d, rs in after.devices.items():
        for old in (before.devices[d], None):
            assert summary(old, rs, Budget()) == plan_device(old, rs, Budget()).summary()


def test_an_entry_with_no_ports_allows_nothing_as_the_policy_reads_it() -> None:
    """allowed_flows lists the ports an entry allows: `ports: []` is no flow to the Rego (`input.port in
    ports`) and to expand_allowed, so the compiler must not read it as the IR's "any port"."""
    f = small()
    base = allowed_flows(f)
    empty = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [], "reason": "grant:none",
             "sources": ["globex/batch"]}
    assert expand_allowed([empty]) == {}
    plain = compile_fabric(f, base, revoked_ids(f))
    compiled = compile_fabric(f, [*base, empty], revoked_ids(f))
    assert not [r for rs in compiled.devices.values() for r in rs.rules if "grant:none" in r.reasons]
    assert {d: rs.canonical for d, rs in compiled.devices.items()} == {
        d: rs.canonical for d, rs in plain.devices.items()}
    assert verify(compiled, [*base, empty], exhaustive=True) == []
    # and a recompile that empties an entry's ports withdraws what it allowed
    some = {**empty, "ports": [5432]}
    before = compile_fabric(f, [*base, some], revoked_ids(f))
    after = recompile(before, [*base, empty])
    assert {d: rs.canonical for d, rs in after.devices.items()} == {d: rs.canonical for d, rs in plain.devices.items()}
