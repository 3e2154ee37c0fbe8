"""The SuperNIC pipeline's table 0 (enforcer/render/openflow.py): what it admits from a host port and from the
uplink, and what the match costs.

A frame from a workload's port is admitted only untagged: a tagged one would be tagged again by table 3's (or
ARP's, ND's) push_vlan and leave on the uplink double-tagged, the inner tag the workload's choice. That it is
dropped on a real Open vSwitch, while untagged traffic passes, is
tests/enforcer/test_ovs_traffic.py::test_a_workload_cannot_put_a_vlan_tag_on_the_fabric.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from enforcer.compiler import compile_fabric
from enforcer.cost import NIC_FIXED, NIC_PER_PORT, NIC_PER_V4, NIC_PER_V6
from enforcer.fabric import revoked_ids
from enforcer.ir import DeviceRuleSet
from enforcer.render.openflow import T_CLASSIFY, T_TO_HOST, T_TO_NET, UNTAGGED, OfFlow, render_flows
from tests.enforcer.helpers import allowed_flows, compile_small, small

ROCE = {"dst_tenant": "acme", "dst_group": "data", "proto": "udp", "ports": [4791, 9000], "reason": "grant:roce",
        "sources": ["acme/train"]}


def _nics() -> list[DeviceRuleSet]:
    f = small()
    with_roce = compile_fabric(f, [*allowed_flows(f), ROCE], revoked_ids(f))
    return [rs for c in (compile_small()[0], with_roce) for rs in c.devices.values() if rs.kind == "nic"]


def _fields(flow: OfFlow) -> list[str]:
    return flow.match.split(",") if flow.match else []


def test_untagged_is_no_802_1q_header_at_all_not_even_a_priority_tag() -> None:
    # OVS sets the "present" bit 0x1000 in vlan_tci for every tagged frame (VID 0 too): with it in the mask and
    # zero, only untagged frames match; vlan_tci=0x0000/0x0fff would admit VID 0 priority tags (any PCP)
    value, mask = (int(x, 16) for x in UNTAGGED.removeprefix("vlan_tci=").split("/"))
    assert value == 0 and mask & 0x1000 and mask & 0x0FFF == 0x0FFF


def test_every_table_0_flow_from_a_host_port_requires_an_untagged_frame() -> None:
    checked = 0
    for rs in _nics():
        hosts = {f"in_port={p.name}" for p in rs.ports}
        for flow in render_flows(rs):
            fields = _fields(flow)
            if flow.table != T_CLASSIFY:
                continue
            if not fields:  # the classifier's final drop: nothing from a host port gets past table 0 otherwise
                assert (flow.priority, flow.actions) == (0, "drop")
                continue
            if fields[0] in hosts:
                assert fields[1] == UNTAGGED, flow.text()
                checked += 1
            else:  # from the uplink: only on a tenant's VLAN, which the flow takes off before anything else
                assert fields[0] == f"in_port={rs.uplink}" and fields[1].startswith("dl_vlan="), flow.text()
                assert flow.actions.startswith("pop_vlan,"), flow.text()
    assert checked > 20


def test_the_only_tag_pushed_is_the_ports_tenant_vlan_and_no_flow_was_added_for_it() -> None:
    for rs in _nics():
        flows = render_flows(rs)
        for p in rs.ports:
            tag = f"push_vlan:0x8100,set_field:{4096 + p.vlan}->vlan_vid,output:{rs.uplink}"
            pushes = [f for f in flows if "push_vlan" in f.actions and _fields(f)[0] == f"in_port={p.name}"]
            assert pushes and all(f.actions == tag for f in pushes)
        # the per-address and per-port flows are exactly what enforcer/cost.py budgets: the untagged match
        # narrows table 0's flows, it adds none
        v4 = sum(len(p.v4) for p in rs.ports)
        v6 = sum(len(p.v6) for p in rs.ports)
        plumbing = [f for f in flows if f.table in (T_CLASSIFY, T_TO_HOST, T_TO_NET) and f.priority > 0]
        assert len(plumbing) == NIC_PER_V4 * v4 + NIC_PER_V6 * v6 + NIC_PER_PORT * len(rs.ports)
        assert len([f for f in flows if f.cookie == 0]) == len(plumbing) + NIC_FIXED


@pytest.mark.parametrize("field,value", [("action", "reject"), ("state", "related"), ("direction", "inbound"),
                                         ("proto", "icmp")])
def test_a_rule_outside_the_ir_vocabulary_is_refused_not_read_as_an_allow(field: str, value: str) -> None:
    """The renderer reads a rule's action, state, direction and protocol as one of their values or not at all:
    before, anything but `deny` was an allow, any state but `stateless`/`established` a stateful `+new` allow and
    any direction but `egress` ingress."""
    rs = next(rs for rs in _nics() if any(r.action == "allow" and r.state == "new" for r in rs.rules))
    i = next(i for i, r in enumerate(rs.rules) if r.action == "allow" and r.state == "new")
    fields: dict[str, Any] = {field: value}
    bad = rs.rules[i]._replace(**fields)
    odd = dataclasses.replace(rs, rules=(*rs.rules[:i], bad, *rs.rules[i + 1:]))
    with pytest.raises(ValueError, match="cannot render"):
        render_flows(odd)


def test_a_stateful_allow_of_any_protocol_is_refused() -> None:
    """`*` is in the IR's vocabulary for the established rule and the final deny, but a `+new` allow of any
    protocol would commit ICMP, SCTP, GRE... to conntrack, and an apply cuts only the TCP/UDP connections it
    withdraws (OvsBackend.forget_withdrawn): such a connection would outlive the allow's withdrawal. The compiler
    never makes one; a rule set that holds one is refused."""
    rs = next(rs for rs in _nics() if any(r.action == "allow" and r.state == "new" for r in rs.rules))
    i = next(i for i, r in enumerate(rs.rules) if r.action == "allow" and r.state == "new")
    odd = dataclasses.replace(rs, rules=(*rs.rules[:i], rs.rules[i]._replace(proto="*", ports=()), *rs.rules[i + 1:]))
    with pytest.raises(ValueError, match="tcp or udp"):
        render_flows(odd)
