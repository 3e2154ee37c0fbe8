"""What the allowed_flows entries put on each device, aggregated, and each device's rule set assembled from it.

Entries are taken by family: the entries of one destination group and protocol. Every match a rule has
(direction, scope, source set, destination set, port side, state) names its family's destination group and
its protocol: an egress or leaf forward rule as its destination set, an ingress rule as `<group>@<node>`, a
leaf return rule as its source `<group>@<leaf>`; forward and return rules differ in port side (RoCEv2's
return rule, on destination port 4791, in destination set: the source tenants' `tenants:...` prefixes), egress
and ingress in direction, a NIC's conntrack and RoCEv2 rules in state. So only rules of one family can share a
match: aggregation never looks beyond the family, a family's rules are final when the family is done, and a
recompile redoes the families of the changed entries and patches what they put on the devices those entries
touch.

Within one device the allow rules, all at one priority, then sort as plain tuples, which is the order of
rule_order (it lists the fields in the tuple's order), whatever the names: two rules may share direction,
scope, source, destination and protocol and differ in port side (a destination group named like a return
rule's `tenants:...` set; a return rule and a RoCEv2 one, see `_raws`).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from enforcer.context import Context, FabricIndex
from enforcer.cost import leaf_cost, leaf_rule_cost, nic_cost, nic_fixed_cost, nic_rule_cost
from enforcer.fabric import Fabric, Placement
from enforcer.ir import (
    ANY,
    PRIO_ALLOW,
    PRIO_DENY,
    PRIO_ESTABLISHED,
    ROCE_PORTS,
    STATELESS,
    AddressSet,
    DeviceRuleSet,
    FlowRule,
    Leak,
    Port,
    Vrf,
    range_covers,
    roce_split,
)

if TYPE_CHECKING:
    from enforcer.compiler import Entry

CONNTRACK_RETURN = "conntrack-return"
DEFAULT_DENY = "default-deny"

# a leaf's leak instances: importing tenant -> (prefix, from tenant) -> reason -> how many entries need it
Leaks = dict[str, dict[tuple[str, str], dict[str, int]]]
Ports = tuple[tuple[int, int], ...]
# device, direction, scope, source set, destination set, port side, state, ports: one entry's rule before
# aggregation
Raw = tuple["Acc", str, str, AddressSet, AddressSet, str, str, Ports]

NIC_HEAD = tuple(FlowRule(PRIO_ESTABLISHED, d, "", ANY, ANY, "*", (), "dst", "established", "allow",
                          (CONNTRACK_RETURN,)) for d in ("egress", "ingress"))
NIC_TAIL = tuple(FlowRule(PRIO_DENY, d, "", ANY, ANY, "*", (), "dst", s, "deny", (DEFAULT_DENY,))
                 for d in ("egress", "ingress") for s in ("new", STATELESS))  # STATELESS: RoCEv2 nobody allows
NIC_FRAME_COST = sum(nic_rule_cost(r, {}) for r in NIC_HEAD + NIC_TAIL)


def leaf_deny(tenant: str) -> FlowRule:
    return FlowRule(PRIO_DENY, "inbound", tenant, ANY, ANY, "*", (), "dst", "any", "deny", (DEFAULT_DENY,))


class Acc:
    """One device's share of some families: allow rules, the sets they name, their cost, counted leaks."""

    __slots__ = ("cost", "device", "leaks", "rules", "sets")

    def __init__(self, device: str) -> None:
        self.device = device
        self.rules: list[FlowRule] = []
        self.sets: dict[str, AddressSet] = {}
        self.cost = 0
        self.leaks: Leaks = {}  # leaf only


_new = tuple.__new__  # a NamedTuple built without its Python-level __new__: the same object, made faster


class Emitter:
    """Puts families' rules and leaks into per-device accumulators; `track` records each entry's devices."""

    def __init__(self, ctx: Context, accs: dict[str, Acc] | None = None,
                 track: dict[tuple[str, str, str], set[str]] | None = None) -> None:
        self.ctx = ctx
        self.accs: dict[str, Acc] = accs if accs is not None else {}
        self.track = track
        self._one = ctx.index.one_reason

    def acc(self, device: str) -> Acc:
        a = self.accs.get(device)
        if a is None:
            a = self.accs[device] = Acc(device)
        return a

    def family(self, entries: Sequence[Entry]) -> None:
        """Every rule of the entries (one destination group and protocol), aggregated, into the accumulators."""
        if not entries:
            return
        if len(entries) == 1:  # the common case: every match is one raw rule, nothing to merge or shadow
            e = entries[0]
            self._put(self._raws(e), self._reasons(e.reason), e.proto)
            return
        proto = entries[0].proto
        groups: dict[tuple[str, str, str, str, str, str, str], tuple[Raw, list[tuple[Ports, str]]]] = {}
        for e in entries:
            for raw in self._raws(e):
                a, direction, scope, s, d, side, state, ports = raw
                k = (a.device, direction, scope, s.name, d.name, side, state)
                g = groups.get(k)
                if g is None:
                    groups[k] = (raw, [(ports, e.reason)])
                else:
                    g[1].append((ports, e.reason))
        for raw, pairs in groups.values():
            if len(pairs) == 1:
                self._put((raw,), self._reasons(pairs[0][1]), proto)
            else:
                for ports, reasons in aggregate(pairs):
                    self._put((raw,), reasons, proto, ports)

    def _reasons(self, reason: str) -> tuple[str, ...]:
        one = self._one.get(reason)
        if one is None:
            one = self._one[reason] = (reason,)
        return one


    @staticmethod
    def _put(raws: Iterable[Raw], reasons: tuple[str, ...], proto: str, ports: Ports | None = None) -> None:
        """The raws as rules, each with its own ports unless `ports` (an aggregate's) replaces them."""
        for a, direction, scope, s, d, side, state, own in raws:
            src, dst = s.name, d.name
            p = own if ports is None else ports
            a.rules.append(_new(FlowRule, (PRIO_ALLOW, direction, scope, src, dst, proto, p, side, state, "allow",
                                           reasons)))
            sets = a.sets
            sets[src] = s
            sets[dst] = d
            if direction == "inbound":
                a.cost += leaf_cost(len(s.v4), len(s.v6), len(d.v4), len(d.v6), p)
            else:
                a.cost += nic_cost(len(s.v4), len(s.v6), len(d.v4), len(d.v6), p, state == STATELESS)

    def _raws(self, e: Entry) -> list[Raw]:
        """What one entry becomes (S = its source groups' workloads, D = its destination group's):
          - on the SuperNIC of every node hosting part of S: an `egress` rule  S-on-this-node -> D;
          - on the SuperNIC of every node hosting part of D: an `ingress` rule S -> D-on-this-node;
          - on the leaf of every node hosting part of S: a rule S-on-this-leaf -> D in the source tenant's ACL;
          - on the leaf of every node hosting part of D: a stateless return rule D-on-this-leaf (source port =
            the service ports) -> the source tenants' prefixes, in the destination tenant's ACL;
          - across tenants, the leaks (counted here): D's addresses into the source VRF on the source leaves,
            each source tenant's part of S into the destination VRF on the destination leaves.
        RoCEv2 (UDP to 4791, ir.roce_split) skips conntrack: the NIC rules' share of it is a `stateless` rule of
        its own (the same match: it admits S -> D and the mirror D -> S, both to 4791), the stateful rules keep the
        other ports; on the leaf the forward rule keeps every port (RoCEv2 to D goes to 4791), and RoCEv2 back
        from D, to 4791 from any port, gets a return rule on destination port 4791 beside the source-port one."""
        ctx = self.ctx
        index = ctx.index
        members = ctx.members
        dmem = members.get(e.dst, ())
        smem_by = [(s, members.get(s, ())) for s in e.sources]
        smem = [p for _, ps in smem_by for p in ps]
        if not dmem or not smem:
            return []
        out: list[Raw] = []
        accs = self.accs
        acc = self.acc
        dt, reason = e.dst_tenant, e.reason
        src_tenants = sorted({s.split("/", 1)[0] for s, ps in smem_by if ps})
        src_name = e.sources[0] if len(e.sources) == 1 else f"src:{e.dst}:{e.proto}:{reason}"
        dst_name = e.dst
        tenants_name = f"tenants:{src_tenants[0]}" if len(src_tenants) == 1 else f"tenants:{src_name}"
        leaf_of, tenant_of, nic_dev, leaf_dev = index.leaf_of, index.tenant_of, index.nic_dev, index.leaf_dev
        kept, roce = roce_split(e.proto, e.ports)
        # (state, ports) of the NIC rules, (port side, ports) of the leaf return rules
        nic: list[tuple[str, Ports]] = [] if kept is None else [("new", kept)]
        ret: list[tuple[str, Ports]] = [] if kept is None else [("src", kept)]
        if roce:
            nic.append((STATELESS, ROCE_PORTS))
            ret.append(("dst", ROCE_PORTS))
        addr = ctx.address_set
        # a source set named after the entry (several source groups) is this entry's alone: no cache
        src_set = addr if len(e.sources) == 1 else ctx.address_set_once
        # SuperNIC egress (sources on this node) and leaf forward rules (sources on this leaf, per tenant)
        by_node: dict[str, list[Placement]] = {}
        by_leaf: dict[tuple[str, str], list[Placement]] = {}
        for p in smem:
            by_node.setdefault(p.node, []).append(p)
            by_leaf.setdefault((leaf_of[p.node], tenant_of[p.workload]), []).append(p)
        d_nic = addr("nic", dst_name, dmem)
        for node, ps in by_node.items():
            device = nic_dev[node]
            a = accs.get(device) or acc(device)
            s_node = src_set("nic", f"{src_name}@{node}", ps)
            for state, ports in nic:
                out.append((a, "egress", "", s_node, d_nic, "dst", state, ports))
        d_leaf = addr("leaf", dst_name, dmem)
        d_prefixes = d_leaf.v4 + d_leaf.v6
        one_tenant = len(src_tenants) == 1
        for (leaf, ts), ps in by_leaf.items():
            device = leaf_dev[leaf]
            a = accs.get(device) or acc(device)
            name = f"{src_name}@{leaf}" if one_tenant else f"{src_name}@{leaf}/{ts}"
            out.append((a, "inbound", ts, src_set("leaf", name, ps), d_leaf, "dst", "any", e.ports))
            if ts != dt:
                by = a.leaks.get(ts)
                _count(by if by is not None else a.leaks.setdefault(ts, {}), d_prefixes, dt, reason)
        # SuperNIC ingress (destinations on this node) and leaf return rules (destinations on this leaf)
        d_by_node: dict[str, list[Placement]] = {}
        d_by_leaf: dict[str, list[Placement]] = {}
        for p in dmem:
            d_by_node.setdefault(p.node, []).append(p)
            d_by_leaf.setdefault(leaf_of[p.node], []).append(p)
        s_all = src_set("nic", src_name, smem)
        for node, ps in d_by_node.items():
            device = nic_dev[node]
            a = accs.get(device) or acc(device)
            d_node = addr("nic", f"{dst_name}@{node}", ps)
            for state, ports in nic:
                out.append((a, "ingress", "", s_all, d_node, "dst", state, ports))
        t_set = ctx.prefix_set("leaf", tenants_name, src_tenants)
        back: list[tuple[str, tuple[str, ...]]] | None = None  # each other source tenant's part of S
        for leaf, ps in d_by_leaf.items():
            device = leaf_dev[leaf]
            a = accs.get(device) or acc(device)
            d_here = addr("leaf", f"{dst_name}@{leaf}", ps)
            for side, ports in ret:
                out.append((a, "inbound", dt, d_here, t_set, side, "any", ports))
            if back is None:
                by_tenant: dict[str, list[Placement]] = {}
                for p in smem:
                    by_tenant.setdefault(tenant_of[p.workload], []).append(p)
                back = []
                for ts in src_tenants:
                    if ts != dt:
                        v4, v6 = ctx.addresses(by_tenant[ts])
                        back.append((ts, v4 + v6))
            if back:
                by = a.leaks.get(dt)
                if by is None:
                    by = a.leaks[dt] = {}
                for ts, prefixes in back:
                    _count(by, prefixes, ts, reason)
        if self.track is not None:
            self.track.setdefault(e.key, set()).update(r[0].device for r in out)
        return out


def _count(by: dict[tuple[str, str], dict[str, int]], prefixes: Iterable[str], frm: str, reason: str) -> None:
    for prefix in prefixes:
        k = (prefix, frm)
        c = by.get(k)
        if c is None:
            by[k] = {reason: 1}
        else:
            c[reason] = c.get(reason, 0) + 1


def aggregate(pairs: Sequence[tuple[Ports, str]]) -> list[tuple[Ports, tuple[str, ...]]]:
    """One match's raw rules as (ports, reason): equal ports merge their reasons; ports another rule covers
    are dropped (shadowed), the reason moving over. Sorted by ports."""
    by_ports: dict[Ports, set[str]] = {}
    for ports, reason in pairs:
        by_ports.setdefault(ports, set()).add(reason)
    items = sorted(by_ports.items(), key=lambda kv: (-sum(b - a + 1 for a, b in kv[0]), kv[0]))
    kept: list[tuple[Ports, set[str]]] = []
    for ports, reasons in items:
        cover = next((k for k in kept if range_covers(k[0], ports)), None)
        if cover is not None:
            cover[1].update(reasons)
        else:
            kept.append((ports, set(reasons)))
    return [(ports, tuple(sorted(reasons))) for ports, reasons in sorted(kept, key=lambda k: k[0])]


# ---------------------------------------------------------------- device assembly

def nic_ports(fabric: Fabric, node: str) -> tuple[Port, ...]:
    out = []
    for p in fabric.placements_on.get(node, ()):
        if p.workload not in fabric.workload:
            continue
        t = fabric.tenant[p.workload.split("/", 1)[0]]
        out.append(Port(p.port, t.slug, t.vlan, node, p.workload, (f"{p.ipv4}/32",) if p.ipv4 else (),
                        (f"{p.ipv6}/128",) if p.ipv6 else ()))
    return tuple(sorted(out))


def leaf_ports(fabric: Fabric, leaf: str) -> tuple[Port, ...]:
    out = set()
    for node in fabric.nodes_under.get(leaf, ()):
        att = fabric.attachment[node]
        for p in fabric.placements_on.get(node, ()):
            if p.workload not in fabric.workload:
                continue
            t = fabric.tenant[p.workload.split("/", 1)[0]]
            out.add(Port(f"{att.leaf_port}.{t.vlan}", t.slug, t.vlan, node, base=att.leaf_port))
    return tuple(sorted(out))


def sort_allows(rules: list[FlowRule]) -> list[FlowRule]:
    rules.sort()  # rule_order among rules of one priority
    return rules


def assemble(device: str, index: FabricIndex, allows: Sequence[FlowRule], sets: Mapping[str, AddressSet],
             allow_cost: int, leaks: Leaks) -> DeviceRuleSet:
    """A device's rule set from its sorted allow rules (with the sets they name, and their cost) and leaks."""
    fabric = index.fabric
    kind, name = device.split(":", 1)
    if kind == "nic":
        ports = nic_ports(fabric, name)
        rules = (*NIC_HEAD, *allows, *NIC_TAIL)
        cost = nic_fixed_cost(ports) + NIC_FRAME_COST + allow_cost
        vrfs: tuple[Vrf, ...] = ()
        uplink = fabric.attachment[name].uplink if name in fabric.attachment else ""
    else:
        ports = leaf_ports(fabric, name)
        denies = [leaf_deny(t) for t in sorted({p.tenant for p in ports})]
        rules = (*allows, *denies)
        cost = allow_cost + sum(leaf_rule_cost(r, {}) for r in denies)
        vrfs = leaf_vrfs(index, ports, leaks)
        uplink = ""
    return DeviceRuleSet(device, kind, uplink, ports, tuple(map(sets.__getitem__, sorted(sets))), rules, vrfs, cost)


def leaf_vrfs(index: FabricIndex, ports: tuple[Port, ...], leaks: Leaks) -> tuple[Vrf, ...]:
    """The leaf's VRFs: one per tenant attached, and one per tenant a leak imports into or from (EVPN type-5
    routes need the source VRF on this leaf too); leaks by prefix, then source tenant."""
    members: dict[str, list[str]] = {}
    for p in ports:
        members.setdefault(p.tenant, []).append(p.name)
    vrf_of, one = index.vrf_of, index.one_reason
    by_into: dict[str, tuple[Leak, ...]] = {}
    for into, by in leaks.items():
        members.setdefault(into, [])
        out = []
        for k in sorted(by):
            prefix, frm = k
            members.setdefault(frm, [])
            counted = by[k]
            reasons: tuple[str, ...]
            if len(counted) == 1:
                (reason,) = counted
                reasons = one.get(reason) or one.setdefault(reason, (reason,))
            else:
                reasons = tuple(sorted(counted))
            out.append(_new(Leak, (prefix, vrf_of[frm], reasons)))
        by_into[into] = tuple(out)
    tenant = index.fabric.tenant
    return tuple(Vrf(t.vrf, slug, t.vni, tuple(sorted(members[slug])), t.prefixes, by_into.get(slug, ()))
                 for slug in sorted(members) for t in (tenant[slug],))


def patch(prev: DeviceRuleSet, old: Acc | None, new: Acc | None, leaks: Leaks | None,
          index: FabricIndex) -> DeviceRuleSet:
    """`prev` with the old rules of some families replaced by their new ones (and its leaks by `leaks`)."""
    rules = prev.rules
    if prev.kind == "nic":
        lo, hi = len(NIC_HEAD), len(rules) - len(NIC_TAIL)
    else:
        lo, hi = 0, len(rules)
        while hi and rules[hi - 1].priority != PRIO_ALLOW:
            hi -= 1
    allows = list(rules[lo:hi])
    for r in old.rules if old is not None else ():
        i = bisect.bisect_left(allows, r)
        if i == len(allows) or allows[i] != r:
            raise RuntimeError(f"{prev.device}: the previous compile lost a rule: {r}")
        del allows[i]
    for r in new.rules if new is not None else ():
        bisect.insort(allows, r)
    # the sets: the new families' ones in, the old families' ones out unless another rule still names them
    fresh = new.sets if new is not None else {}
    gone = old.sets.keys() - fresh.keys() if old is not None else set()
    if gone:
        gone -= {r.src for r in allows} | {r.dst for r in allows}
    sets = list(prev.sets)
    for n in sorted(gone):
        i = bisect.bisect_left(sets, n, key=_name)
        del sets[i]
    for n, s in fresh.items():
        i = bisect.bisect_left(sets, n, key=_name)
        if i < len(sets) and sets[i].name == n:
            sets[i] = s
        else:
            sets.insert(i, s)
    cost = prev.cost - (old.cost if old is not None else 0) + (new.cost if new is not None else 0)
    vrfs = prev.vrfs if leaks is None else leaf_vrfs(index, prev.ports, leaks)
    return dataclasses.replace(prev, sets=tuple(sets), rules=(*rules[:lo], *allows, *rules[hi:]), vrfs=vrfs,
                               cost=cost)


def _name(s: AddressSet) -> str:
    return s.name


def patch_leaks(prev: Leaks, old: Acc | None, new: Acc | None, device: str) -> Leaks:
    """A leaf's leak counts with the old families' instances taken out and the new ones in (copied where
    they change: the previous compile keeps its own)."""
    out = dict(prev)
    copied: set[tuple[str, tuple[str, str]] | str] = set()
    for acc, step in ((old, -1), (new, 1)):
        for into, by in (acc.leaks.items() if acc is not None else ()):
            mine = out.get(into)
            if mine is None or into not in copied:  # never change a dict the previous compile holds
                mine = out[into] = dict(mine) if mine is not None else {}
                copied.add(into)
            for k, counted in by.items():
                have = mine.get(k)
                if have is None or (into, k) not in copied:
                    have = mine[k] = dict(have) if have is not None else {}
                    copied.add((into, k))
                for reason, n in counted.items():
                    left = have.get(reason, 0) + step * n
                    if left < 0:
                        raise RuntimeError(f"{device}: the previous compile lost a leak: {into} {k} {reason}")
                    if left:
                        have[reason] = left
                    else:
                        del have[reason]
                if not have:
                    del mine[k]
            if not mine:
                del out[into]
    return out
