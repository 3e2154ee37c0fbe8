"""SuperNIC rule sets as OpenFlow 1.3 flows in `ovs-ofctl` syntax (OVS-DOCA on a BlueField-3; OVS here).

Pipeline of one NIC bridge (U = the uplink, P = a host port / VF representor, V = its tenant's VLAN, which
is also the tenant's conntrack zone, carried in reg6):
  table 0  classify: from P only untagged frames (`vlan_tci=0x0000/0x1fff`: no 802.1Q/802.1ad header, not even
           a VID 0 priority tag), so the only tag a workload's frame carries on the fabric is V, pushed here;
           ARP and IPv6 ND of a local address pass straight through (tagged with V towards U): from P, ARP
           with P's own sender address, a solicitation from P's own address, an advertisement of P's own
           address (its nd_target) from it;
           RoCEv2 (UDP to 4791) from P with P's own source address -> table 5, from U tagged V to a local
           address -> untag, table 6: never through conntrack (NVIDIA's BlueField "CT offload" example lets
           `udp,tp_dst=4791` skip `ct` the same way: hardware conntrack does not support RoCE);
           other IP from P with P's own source address -> ct(zone=V, table=1)  (anything else from P: dropped,
           so a workload cannot spoof); IP from U tagged V to a local address -> untag, ct(zone=V, table=2)
  table 1  egress (from a local workload), table 2 ingress (to one): `ct_state=+inv` drop; `+est` (a
           committed connection, either direction: conntrack return) continue; allowed `+new` ->
           ct(commit, zone=V) and continue; everything else drop (default deny)
  table 5  RoCEv2 egress, table 6 RoCEv2 ingress: stateless. A `stateless` rule S -> D puts S -> D into its
           own direction's table and the mirror D -> S into the other (RoCEv2 responses and ACKs also go to
           4791, from a varying source port); everything else drop (RoCEv2 that no policy allows)
  table 3  to the network: tag with V, out U          table 4  to the host: out P by destination address
No stateless table matches reg6 or a VLAN: table 0 let a packet in only with its port's own address (from P)
or to a local address on that address's tenant VLAN (from U), and a local address belongs to one port, of one
tenant (tenants' prefixes never overlap), so the address match already pins the tenant.
An allow rule costs |S| x |D| x |ports| plain flows or, when cheaper, one conjunction: |S| + |D| + |ports|
dimension flows and one `conj_id` flow (OVS's conjunctive match, as OVN builds it from address sets).
Dimension flows with the same match are shared between conjunctions (one flow, several conjunction
actions). Every allow flow's cookie names its reasons (see `cookie_for`), so counters map back to the
policy rule or grant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from core.rocev2 import ROCE_V2_PORT
from enforcer.cost import family_members, port_masks
from enforcer.ir import ANY, PRIO_ALLOW, STATELESS, DeviceRuleSet, FlowRule

T_CLASSIFY, T_EGRESS, T_INGRESS, T_TO_NET, T_TO_HOST, T_ROCE_EGRESS, T_ROCE_INGRESS = 0, 1, 2, 3, 4, 5, 6
ROCE_PRIORITY = 350  # table 0: RoCEv2 of a local address, above the ct classification (300) of its other IP
ZONE_REG = "NXM_NX_REG6[0..15]"
# Frames from a host port must be untagged: a tagged one would be tagged again by push_vlan and leave on the
# uplink double-tagged, its inner tag the workload's choice (VLAN hopping). A VID 0 priority tag is refused
# too: the PCP would be the workload's choice of fabric priority (its PFC class), and push_vlan would double-tag
# it (outer V, inner VID 0), which the leaf does not route; lossless RoCEv2 on NVIDIA NICs is classified by
# DSCP (`mlnx_qos --trust dscp`), which needs no tag. OVS sets a "tag present" bit (0x1000) in vlan_tci for
# every tagged frame, so present bit and VID all zero is untagged only, whatever the PCP mask (ovs-fields(7);
# checked with ofproto/trace: a VID 0 PCP 3 frame misses it, and would hit only vlan_tci=0x0000/0x0fff). This
# is the form OpenFlow 1.3 carries (OXM has no PCP in vlan_vid): a plain `vlan_tci=0` is installed as this and
# `diff-flows` would report the difference as drift. No flow is added: the match narrows table 0's own flows.
UNTAGGED = "vlan_tci=0x0000/0x1fff"
PLAIN_PRIORITY = PRIO_ALLOW + 10  # plain allows above the conjunctive ones; both only allow


@dataclass(frozen=True, order=True)
class OfFlow:
    table: int
    priority: int
    match: str
    actions: str
    cookie: int = 0

    def text(self) -> str:
        match = f",{self.match}" if self.match else ""
        return f"cookie={self.cookie:#x},table={self.table},priority={self.priority}{match} actions={self.actions}"


def cookie_for(reasons: tuple[str, ...]) -> int:
    """A stable 60-bit cookie for a rule's reasons (the same reasons always give the same cookie)."""
    return int(hashlib.sha256("|".join(reasons).encode()).hexdigest()[:15], 16)


def _host(cidr: str) -> str:
    return cidr.split("/", 1)[0]


def _vlan_tag(vlan: int) -> str:
    return f"push_vlan:0x8100,set_field:{4096 + vlan}->vlan_vid"


class _Builder:
    def __init__(self) -> None:
        self.flows: dict[tuple[int, int, str], tuple[list[str], int]] = {}
        self.next_conj = 1

    def add(self, table: int, priority: int, match: str, actions: str, cookie: int = 0) -> None:
        key = (table, priority, match)
        prev = self.flows.get(key)
        if prev is None:
            self.flows[key] = ([actions], cookie)
        elif actions.startswith("conjunction(") and all(a.startswith("conjunction(") for a in prev[0]):
            prev[0].append(actions)  # one dimension flow serving several conjunctions
        elif actions not in prev[0]:
            raise ValueError(f"two flows with one match and priority but different actions: {key}")

    def result(self) -> list[OfFlow]:
        return sorted((OfFlow(t, p, m, ",".join(a), c) for (t, p, m), (a, c) in self.flows.items()),
                      key=lambda f: (f.table, -f.priority, f.match, f.actions))


def render_flows(rs: DeviceRuleSet, port_names: Mapping[str, str] | None = None) -> list[OfFlow]:
    """The structured flows of one NIC rule set (in table, priority, match order)."""
    if rs.kind != "nic":
        raise ValueError(f"{rs.device} is not a SuperNIC")
    names = dict(port_names or {})
    up = names.get(rs.uplink, rs.uplink)
    b = _Builder()
    b.add(T_CLASSIFY, 0, "", "drop")
    for p in rs.ports:
        port = names.get(p.name, p.name)
        host = f"in_port={port},{UNTAGGED}"  # table 0's match of frames from this host port
        tag, v = _vlan_tag(p.vlan), p.vlan
        zone = f"set_field:{v}->reg6"
        b.add(T_TO_NET, 100, f"in_port={port}", f"{tag},output:{up}")
        for a in map(_host, p.v4):
            b.add(T_CLASSIFY, 400, f"{host},arp,arp_spa={a}", f"{tag},output:{up}")
            b.add(T_CLASSIFY, 400, f"in_port={up},dl_vlan={v},arp,arp_tpa={a}", f"pop_vlan,output:{port}")
            b.add(T_CLASSIFY, ROCE_PRIORITY, f"{host},udp,nw_src={a},tp_dst={ROCE_V2_PORT}",
                  f"resubmit(,{T_ROCE_EGRESS})")
            b.add(T_CLASSIFY, ROCE_PRIORITY, f"in_port={up},dl_vlan={v},udp,nw_dst={a},tp_dst={ROCE_V2_PORT}",
                  f"pop_vlan,resubmit(,{T_ROCE_INGRESS})")
            b.add(T_CLASSIFY, 300, f"{host},ip,nw_src={a}", f"{zone},ct(zone={ZONE_REG},table={T_EGRESS})")
            b.add(T_CLASSIFY, 300, f"in_port={up},dl_vlan={v},ip,nw_dst={a}",
                  f"pop_vlan,{zone},ct(zone={ZONE_REG},table={T_INGRESS})")
            b.add(T_TO_HOST, 100, f"ip,nw_dst={a}", f"output:{port}")
        for a in map(_host, p.v6):
            # An advertisement (136) names the address it is for in its body (nd_target), not in its source: only
            # its own. One naming another address (its tenant's, the leaf's gateway) as at the workload's MAC,
            # override set, would have the leaf send that address's traffic to this attachment, where table 0
            # drops it. A solicitation (135) speaks for its source (its source link-layer address option).
            b.add(T_CLASSIFY, 400, f"{host},icmp6,ipv6_src={a},icmp_type=135", f"{tag},output:{up}")
            b.add(T_CLASSIFY, 400, f"{host},icmp6,ipv6_src={a},icmp_type=136,nd_target={a}", f"{tag},output:{up}")
            b.add(T_CLASSIFY, 400, f"in_port={up},dl_vlan={v},icmp6,icmp_type=135,nd_target={a}",
                  f"pop_vlan,output:{port}")
            b.add(T_CLASSIFY, 400, f"in_port={up},dl_vlan={v},icmp6,icmp_type=136,ipv6_dst={a}",
                  f"pop_vlan,output:{port}")
            b.add(T_CLASSIFY, ROCE_PRIORITY, f"{host},udp6,ipv6_src={a},tp_dst={ROCE_V2_PORT}",
                  f"resubmit(,{T_ROCE_EGRESS})")
            b.add(T_CLASSIFY, ROCE_PRIORITY, f"in_port={up},dl_vlan={v},udp6,ipv6_dst={a},tp_dst={ROCE_V2_PORT}",
                  f"pop_vlan,resubmit(,{T_ROCE_INGRESS})")
            b.add(T_CLASSIFY, 300, f"{host},ipv6,ipv6_src={a}",
                  f"{zone},ct(zone={ZONE_REG},table={T_EGRESS})")
            b.add(T_CLASSIFY, 300, f"in_port={up},dl_vlan={v},ipv6,ipv6_dst={a}",
                  f"pop_vlan,{zone},ct(zone={ZONE_REG},table={T_INGRESS})")
            b.add(T_TO_HOST, 100, f"ipv6,ipv6_dst={a}", f"output:{port}")
    for t in (T_EGRESS, T_INGRESS):
        b.add(t, 300, "ct_state=+inv+trk", "drop")
    sets = rs.set_by_name
    for r in rs.rules:
        _rule(b, r, sets)
    return b.result()


_ACTIONS, _STATES, _DIRECTIONS, _PROTOS = {"allow", "deny"}, {"new", "established", STATELESS}, {"egress", "ingress"}, {
    "tcp", "udp", "*"}


def _rule(b: _Builder, r: FlowRule, sets: Mapping[str, object]) -> None:
    # Every field is read as one of its few values, and anything else refuses the rule set (fail closed): read by
    # elimination, an action "reject" rendered as an allow, a state "related" as `+new` and a direction "inbound"
    # (a leaf's) as ingress.
    if r.action not in _ACTIONS or r.state not in _STATES or r.direction not in _DIRECTIONS or r.proto not in _PROTOS:
        raise ValueError(f"a NIC rule set holds a rule it cannot render: action {r.action!r}, state {r.state!r}, "
                         f"direction {r.direction!r}, proto {r.proto!r}")
    stateless = r.state == STATELESS
    egress = r.direction == "egress"
    table = (T_ROCE_EGRESS if egress else T_ROCE_INGRESS) if stateless else (T_EGRESS if egress else T_INGRESS)
    forward = f"resubmit(,{T_TO_NET if egress else T_TO_HOST})"
    if r.action == "deny":
        if r.src != ANY or r.dst != ANY or r.proto != "*":
            raise ValueError("only the final catch-all deny is rendered; allows are the policy")
        b.add(table, r.priority, "", "drop", cookie_for(r.reasons))
        return
    if r.state == "established":
        b.add(table, r.priority, "ct_state=+est+trk", forward, cookie_for(r.reasons))
        return
    if stateless:
        if r.proto != "udp" or r.ports != ((ROCE_V2_PORT, ROCE_V2_PORT),):
            raise ValueError("a stateless rule is RoCEv2: udp to port 4791 only (nothing else skips conntrack)")
        # its own direction, and the mirror (dst -> src, also to 4791) in the other direction's table
        _allow(b, table, "", r.src, r.dst, r, sets, forward)
        back = f"resubmit(,{T_TO_HOST if egress else T_TO_NET})"
        _allow(b, T_ROCE_INGRESS if egress else T_ROCE_EGRESS, "", r.dst, r.src, r, sets, back)
        return
    if r.proto == ANY:  # the compiler allows tcp or udp only, and an apply cuts only their withdrawn connections
        raise ValueError("a stateful allow names tcp or udp: one of any protocol would commit ICMP and other "
                         "protocols to conntrack, whose connections no apply would cut when it is withdrawn")
    _allow(b, table, "ct_state=+new+trk,", r.src, r.dst, r, sets, f"ct(commit,zone={ZONE_REG}),{forward}")


def _allow(b: _Builder, table: int, state: str, src_set: str, dst_set: str, r: FlowRule,
           sets: Mapping[str, object], allow: str) -> None:
    """The flows of one allow from src_set to dst_set in `table`: plain, or one conjunction when cheaper."""
    cookie = cookie_for(r.reasons)
    masks = [m for lo, hi in r.ports for m in port_masks(lo, hi)]
    for fam in (4, 6):
        src = family_members(sets.get(src_set), fam) if src_set != ANY else ("*",)  # type: ignore[arg-type]
        dst = family_members(sets.get(dst_set), fam) if dst_set != ANY else ("*",)  # type: ignore[arg-type]
        if not src or not dst:
            continue
        proto = r.proto if fam == 4 else f"{r.proto}6"
        if r.proto == "*":
            proto = "ip" if fam == 4 else "ipv6"
        base = f"{state}{proto}"
        sf, df = ("nw_src", "nw_dst") if fam == 4 else ("ipv6_src", "ipv6_dst")
        s_m = [f"{sf}={a}" for a in src if a != "*"] or [""]
        d_m = [f"{df}={a}" for a in dst if a != "*"] or [""]
        p_m = [f"tp_dst={v}" if m == 0xFFFF else f"tp_dst={v:#x}/{m:#x}" for v, m in masks] or [""]
        plain = len(s_m) * len(d_m) * len(p_m)
        dims = [d for d in (s_m, d_m, p_m) if d != [""]]
        conj = sum(len(d) for d in dims) + 1
        if plain <= conj or len(dims) < 2:
            for s in s_m:
                for d in d_m:
                    for p in p_m:
                        match = ",".join(x for x in (base, s, d, p) if x)
                        b.add(table, PLAIN_PRIORITY, match, allow, cookie)
            continue
        cid = b.next_conj
        b.next_conj += 1
        for k, dim in enumerate(dims, start=1):
            for x in dim:
                b.add(table, PRIO_ALLOW, f"{base},{x}", f"conjunction({cid},{k}/{len(dims)})")
        b.add(table, PRIO_ALLOW, f"{base},conj_id={cid}", allow, cookie)


def render_openflow(rs: DeviceRuleSet, port_names: Mapping[str, str] | None = None) -> str:
    """The text `ovs-ofctl -O OpenFlow13 --bundle replace-flows <bridge> -` takes, one flow a line."""
    return "".join(f.text() + "\n" for f in render_flows(rs, port_names))


def cookie_map(rs: DeviceRuleSet) -> dict[int, tuple[str, ...]]:
    """cookie -> the reasons of the rules carrying it (to read flow counters back as policy rules/grants)."""
    return {cookie_for(r.reasons): r.reasons for r in rs.rules}
