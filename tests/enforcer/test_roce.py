"""RoCEv2 (UDP to port 4791) skips conntrack on the SuperNIC: the compiler's stateless rules, their exact
OpenFlow, their cost, the leaf's return rule for RoCEv2 coming back, and the equivalence walk of both ways.

NVIDIA's "Virtual Switch on BlueField" guide (Connection Tracking Offload) lets `udp,tp_dst=4791` skip `ct`
("RoCE traffic is not supported by CT"; RoCEv2 packets go to UDP port 4791 with a different source port in
each direction), so every RoCEv2 packet through `ct` would stay on the Arm cores.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from enforcer.compiler import Compiled, compile_fabric, contributors, recompile
from enforcer.cost import nic_rule_cost, set_sizes
from enforcer.equivalence import ROCE_NOTE, Walker, verify
from enforcer.fabric import Fabric, Grant, revoked_ids
from enforcer.ir import STATELESS, FlowRule, roce_split
from enforcer.render.linux import render_linux
from enforcer.render.nvue import render_nvue
from enforcer.render.openflow import ROCE_PRIORITY, T_ROCE_EGRESS, T_ROCE_INGRESS, cookie_for, render_flows
from tests.enforcer.gen import fabrics
from tests.enforcer.helpers import allowed_flows, small

ROCE = {"dst_tenant": "acme", "dst_group": "data", "proto": "udp", "ports": [4791, 9000], "reason": "grant:roce",
        "sources": ["acme/train"]}
# globex/api/a1 (gpu3, leaf2) -> acme/train (w1 on gpu1, leaf1; w2 on gpu3): across tenants and leaves
CROSS = {"dst_tenant": "acme", "dst_group": "train", "proto": "udp", "ports": [4791], "reason": "grant:gpu",
         "sources": ["globex/api"]}


def _compile(*extra: dict[str, Any]) -> tuple[Compiled, list[Any]]:
    f = small()
    allowed = [*allowed_flows(f), *extra]
    return compile_fabric(f, allowed, revoked_ids(f)), allowed


def _rules(c: Compiled, device: str, reason: str) -> list[FlowRule]:
    return [r for r in c.devices[device].rules if reason in r.reasons]


def test_roce_split_carves_4791_out_of_udp_only() -> None:
    assert roce_split("udp", ((4791, 4791),)) == (None, True)
    assert roce_split("udp", ((53, 53), (4791, 4791))) == (((53, 53),), True)
    assert roce_split("udp", ((4000, 5000),)) == (((4000, 4790), (4792, 5000)), True)
    assert roce_split("udp", ((4791, 4800),)) == (((4792, 4800),), True)
    assert roce_split("udp", ()) == ((), True)  # any port: RoCEv2 too, the any-port rule stays whole
    assert roce_split("udp", ((53, 53),)) == (((53, 53),), False)
    assert roce_split("tcp", ((4791, 4791),)) == (((4791, 4791),), False)  # RoCEv2 is UDP


def test_the_nic_rules_of_a_roce_grant_are_stateless_and_the_other_ports_keep_conntrack() -> None:
    c, _ = _compile(ROCE)
    # w1 on gpu1 -> db1 on gpu2 (and w2 on gpu3 -> db1)
    assert _rules(c, "nic:gpu1", "grant:roce") == [
        FlowRule(100, "egress", "", "acme/train@gpu1", "acme/data", "udp", ((4791, 4791),), "dst", STATELESS,
                 "allow", ("grant:roce",)),
        FlowRule(100, "egress", "", "acme/train@gpu1", "acme/data", "udp", ((9000, 9000),), "dst", "new",
                 "allow", ("grant:roce",))]
    assert _rules(c, "nic:gpu2", "grant:roce") == [
        FlowRule(100, "ingress", "", "acme/train", "acme/data@gpu2", "udp", ((4791, 4791),), "dst", STATELESS,
                 "allow", ("grant:roce",)),
        FlowRule(100, "ingress", "", "acme/train", "acme/data@gpu2", "udp", ((9000, 9000),), "dst", "new",
                 "allow", ("grant:roce",))]
    # RoCEv2 that no rule allows meets a deny of its own on every NIC
    tail = [r for r in c.devices["nic:gpu2"].rules if r.action == "deny"]
    assert [(r.direction, r.state) for r in tail] == [("egress", "new"), ("egress", STATELESS),
                                                      ("ingress", "new"), ("ingress", STATELESS)]


def test_a_grant_of_4791_alone_has_no_conntrack_rule() -> None:
    c, _ = _compile(CROSS)
    for device in ("nic:gpu1", "nic:gpu3"):
        assert {(r.state, r.ports) for r in _rules(c, device, "grant:gpu")} == {(STATELESS, ((4791, 4791),))}


def test_the_exact_openflow_of_a_stateless_rule_both_ways_and_no_ct() -> None:
    c, _ = _compile(ROCE)
    rs = c.devices["nic:gpu2"]
    cookie = cookie_for(("grant:roce",))
    flows = [f.text() for f in render_flows(rs) if f.table in (T_ROCE_EGRESS, T_ROCE_INGRESS)]
    deny = cookie_for(("default-deny",))
    assert flows == [
        # the mirror of the ingress rule: db1's RoCEv2 back to train, to 4791, out to the network
        f"cookie={cookie:#x},table=5,priority=110,udp,nw_src=10.1.0.21/32,nw_dst=10.1.0.11/32,tp_dst=4791 "
        "actions=resubmit(,3)",
        f"cookie={cookie:#x},table=5,priority=110,udp,nw_src=10.1.0.21/32,nw_dst=10.1.0.12/32,tp_dst=4791 "
        "actions=resubmit(,3)",
        f"cookie={cookie:#x},table=5,priority=110,udp6,ipv6_src=fd00:1::21/128,ipv6_dst=fd00:1::11/128,"
        "tp_dst=4791 actions=resubmit(,3)",
        f"cookie={deny:#x},table=5,priority=0 actions=drop",
        # the ingress rule itself: train's RoCEv2 to db1, to the host
        f"cookie={cookie:#x},table=6,priority=110,udp,nw_src=10.1.0.11/32,nw_dst=10.1.0.21/32,tp_dst=4791 "
        "actions=resubmit(,4)",
        f"cookie={cookie:#x},table=6,priority=110,udp,nw_src=10.1.0.12/32,nw_dst=10.1.0.21/32,tp_dst=4791 "
        "actions=resubmit(,4)",
        f"cookie={cookie:#x},table=6,priority=110,udp6,ipv6_src=fd00:1::11/128,ipv6_dst=fd00:1::21/128,"
        "tp_dst=4791 actions=resubmit(,4)",
        f"cookie={deny:#x},table=6,priority=0 actions=drop",
    ]
    text = [f.text() for f in render_flows(rs)]
    # table 0 sends db1's RoCEv2 (its own address only) and RoCEv2 to it (on acme's VLAN) past conntrack
    for line in ("table=0,priority=350,in_port=pf0vf0,vlan_tci=0x0000/0x1fff,udp,nw_src=10.1.0.21,tp_dst=4791 "
                 "actions=resubmit(,5)",
                 "table=0,priority=350,in_port=pf0vf0,vlan_tci=0x0000/0x1fff,udp6,ipv6_src=fd00:1::21,tp_dst=4791 "
                 "actions=resubmit(,5)",
                 "table=0,priority=350,in_port=p0,dl_vlan=101,udp,nw_dst=10.1.0.21,tp_dst=4791 "
                 "actions=pop_vlan,resubmit(,6)",
                 "table=0,priority=350,in_port=p0,dl_vlan=101,udp6,ipv6_dst=fd00:1::21,tp_dst=4791 "
                 "actions=pop_vlan,resubmit(,6)"):
        assert f"cookie=0x0,{line}" in text
    assert ROCE_PRIORITY > 300  # above the ct classification of the same address
    # no flow with 4791 in it goes through conntrack; the grant's other port still does
    assert not [t for t in text if "4791" in t and "ct(" in t]
    assert [t for t in text if "tp_dst=9000" in t] == [
        f"cookie={cookie:#x},table=2,priority=110,ct_state=+new+trk,udp,nw_src=10.1.0.11/32,nw_dst=10.1.0.21/32,"
        "tp_dst=9000 actions=ct(commit,zone=NXM_NX_REG6[0..15]),resubmit(,4)",
        f"cookie={cookie:#x},table=2,priority=110,ct_state=+new+trk,udp,nw_src=10.1.0.12/32,nw_dst=10.1.0.21/32,"
        "tp_dst=9000 actions=ct(commit,zone=NXM_NX_REG6[0..15]),resubmit(,4)",
        f"cookie={cookie:#x},table=2,priority=110,ct_state=+new+trk,udp6,ipv6_src=fd00:1::11/128,"
        "ipv6_dst=fd00:1::21/128,tp_dst=9000 actions=ct(commit,zone=NXM_NX_REG6[0..15]),resubmit(,4)",
    ]


def test_a_stateless_rule_that_is_not_roce_is_refused_by_the_renderer() -> None:
    c, _ = _compile(ROCE)
    rs = c.devices["nic:gpu1"]
    bad = tuple(r._replace(ports=((9000, 9000),)) if r.state == STATELESS and r.action == "allow" else r
                for r in rs.rules)
    with pytest.raises(ValueError, match="RoCEv2"):
        render_flows(dataclasses.replace(rs, rules=bad))


def test_the_cost_counts_both_directions_of_a_stateless_rule_and_covers_the_render() -> None:
    base, _ = _compile()
    c, _ = _compile(ROCE, CROSS)
    for device, rs in c.devices.items():
        if rs.kind != "nic":
            continue
        assert len(render_flows(rs)) <= rs.cost
        sizes = set_sizes(rs.sets)
        # the rule set's cost is its fixed part plus what each rule costs, a stateless one twice
        extra = sum(nic_rule_cost(r, sizes) for r in rs.rules) - sum(
            nic_rule_cost(r, set_sizes(base.devices[device].sets)) for r in base.devices[device].rules)
        assert rs.cost - base.devices[device].cost == extra
    gpu2 = c.devices["nic:gpu2"]
    stateless = next(r for r in gpu2.rules if r.state == STATELESS and r.action == "allow")
    assert nic_rule_cost(stateless, set_sizes(gpu2.sets)) == 2 * nic_rule_cost(
        stateless._replace(state="new"), set_sizes(gpu2.sets))
    assert dict(contributors(gpu2))["grant:roce"] == 6 + 3  # 3 flows each way for RoCEv2, 3 for udp/9000


def test_the_leaf_lets_roce_back_to_the_sources_on_destination_port_4791() -> None:
    """RoCEv2 from db1 back to train goes to 4791 from any port: the source-port return rule (the service
    port answering) cannot match it, a return rule on destination port 4791 does."""
    c, _ = _compile(ROCE)
    assert _rules(c, "leaf:leaf1", "grant:roce") == [
        FlowRule(100, "inbound", "acme", "acme/data@leaf1", "tenants:acme", "udp", ((4791, 4791),), "dst", "any",
                 "allow", ("grant:roce",)),
        FlowRule(100, "inbound", "acme", "acme/data@leaf1", "tenants:acme", "udp", ((9000, 9000),), "src", "any",
                 "allow", ("grant:roce",)),
        FlowRule(100, "inbound", "acme", "acme/train@leaf1", "acme/data", "udp", ((4791, 4791), (9000, 9000)),
                 "dst", "any", "allow", ("grant:roce",)),
    ]
    nvue = render_nvue(c.devices["leaf:leaf1"])
    acl = nvue["acl"]["tf-acme-v4"]["rule"]
    matches = [b["match"]["ip"] for b in acl.values() if b.get("remark") == "grant:roce"]
    assert {"protocol": "udp", "source-ip": "10.1.0.21/32", "dest-ip": "10.1.0.0/16",
            "udp": {"dest-port": {"4791": {}}}} in matches
    assert {"protocol": "udp", "source-ip": "10.1.0.21/32", "dest-ip": "10.1.0.0/16",
            "udp": {"source-port": {"9000": {}}}} in matches
    linux = render_linux(c.devices["leaf:leaf1"], c.fabric)
    ports = [e["match"] for cmd in linux.nft["nftables"] if "rule" in cmd.get("add", {})
             for e in cmd["add"]["rule"]["expr"] if "match" in e and e["match"]["left"].get("payload", {}).get(
                 "protocol") == "udp"]
    assert {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": {"set": [4791]}} in ports


def test_equivalence_walks_roce_both_ways_and_says_it_is_symmetric() -> None:
    c, allowed = _compile(ROCE, CROSS)
    assert verify(c, allowed, exhaustive=True) == []
    assert verify(c, allowed) == []
    f = c.fabric
    w1, db1, a1 = f.placement["acme/train/w1"], f.placement["acme/data/db1"], f.placement["globex/api/a1"]
    walker = Walker(c)
    # the grant is train -> data, and data's RoCEv2 reaches train without a grant of its own
    assert walker.walk(db1, w1, 4, "udp", 4791) == (True, f"allowed by grant:roce ({ROCE_NOTE})")
    assert walker.walk(w1, a1, 4, "udp", 4791) == (True, f"allowed by grant:gpu ({ROCE_NOTE})")
    assert walker.walk(db1, w1, 4, "udp", 9000)[0] is False  # the grant's other port: one way, conntrack
    assert walker.walk(db1, a1, 4, "udp", 4791)[0] is False  # no grant between them either way


def test_equivalence_catches_a_nic_or_leaf_that_drops_roce_coming_back() -> None:
    c, allowed = _compile(ROCE)
    # a NIC whose RoCEv2 rule went through conntrack (what the pipeline did before): the reply side drops
    gpu1 = c.devices["nic:gpu1"]
    old_nic = tuple(r._replace(state="new") if r.state == STATELESS and r.action == "allow" else r
                    for r in gpu1.rules)
    broken = dataclasses.replace(c, devices={**c.devices, "nic:gpu1": dataclasses.replace(gpu1, rules=old_nic)})
    found = verify(broken, allowed, exhaustive=True)
    assert found and all(m.proto == "udp" and m.port == 4791 and m.policy and not m.devices for m in found)
    assert {m.detail.split(":", 2)[1] for m in found} == {"gpu1 egress", "gpu1 ingress"}  # RoCEv2's own deny
    # a leaf whose return rule for RoCEv2 was on the source port, as for any other UDP service
    leaf1 = c.devices["leaf:leaf1"]
    old_leaf = tuple(r._replace(port_side="src") if r.port_side == "dst" and r.dst == "tenants:acme" else r
                     for r in leaf1.rules)
    assert old_leaf != leaf1.rules
    broken = dataclasses.replace(c, devices={**c.devices, "leaf:leaf1": dataclasses.replace(leaf1, rules=old_leaf)})
    found = verify(broken, allowed, exhaustive=True)
    assert found and {m.port for m in found} == {4791}
    assert all("leaf:leaf1 acl acme" in m.detail for m in found)


def test_recompile_adds_and_removes_roce_exactly_like_a_full_compile() -> None:
    base, allowed = _compile()
    inc = recompile(base, [*allowed, ROCE, CROSS])
    full, _ = _compile(ROCE, CROSS)
    assert {d: rs.canonical for d, rs in inc.devices.items()} == {d: rs.canonical for d, rs in full.devices.items()}
    back = recompile(inc, allowed)
    assert {d: rs.canonical for d, rs in back.devices.items()} == {d: rs.canonical for d, rs in base.devices.items()}


def _with_roce(fabric: Fabric, rnd: random.Random) -> Fabric:
    """Most groups expose udp/4791 (beside what they had), most grants carry it: RoCEv2 everywhere."""
    groups = []
    for g in fabric.groups:
        exposed = dict(g.exposed)
        if rnd.random() < 0.8:
            exposed["udp"] = tuple(sorted({*exposed.get("udp", ()), 4791}))
        groups.append(dataclasses.replace(g, exposed=tuple(sorted(exposed.items()))))
    grants: list[Grant] = [dataclasses.replace(x, proto="udp", ports=tuple(sorted({*x.ports, 4791})))
                           if rnd.random() < 0.8 else x for x in fabric.grants]
    return dataclasses.replace(fabric, groups=tuple(groups), grants=tuple(grants))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(fabrics(), st.randoms(use_true_random=False))
def test_generated_fabrics_with_roce_are_equivalent_and_recompile_keeps_up(fabric: Fabric, rnd: random.Random
                                                                           ) -> None:
    fabric = _with_roce(fabric, rnd)
    allowed = allowed_flows(fabric)
    compiled = compile_fabric(fabric, allowed, revoked_ids(fabric))
    assume(any(r.state == STATELESS and r.action == "allow" for rs in compiled.devices.values() for r in rs.rules))
    assert verify(compiled, allowed, exhaustive=True) == []
    assert verify(compiled, allowed) == []
    for rs in compiled.devices.values():
        assert all(r.state != STATELESS or r.action == "deny" or r.ports == ((4791, 4791),) for r in rs.rules)
        if rs.kind == "nic":
            assert len(render_flows(rs)) <= rs.cost
    current = list(allowed)
    for _ in range(3):  # entries dropped and added back: the incremental compile equals a full one
        if current and rnd.random() < 0.5:
            current.pop(rnd.randrange(len(current)))
        elif allowed:
            current.append(rnd.choice(allowed))
        compiled = recompile(compiled, current)
        full = compile_fabric(fabric, current, revoked_ids(fabric))
        assert {d: rs.canonical for d, rs in compiled.devices.items()} == {
            d: rs.canonical for d, rs in full.devices.items()}
