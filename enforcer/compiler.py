"""allowed_flows x fabric -> one DeviceRuleSet per device. Pure and deterministic: same input, same bytes.

Input is the policy's compact `data.flows.allowed_flows` (one entry per destination group, protocol and
reason, with every source group; see rego/flows.rego), never the expanded per-pair set, plus the revoked
workload identities (rego's `revoked_identities`, and the fabric's own revoked workloads).

What each entry becomes (S = the entry's source groups' workloads, D = the destination group's):
  - on the SuperNIC of every node hosting part of S: an `egress` rule  S-on-this-node -> D;
  - on the SuperNIC of every node hosting part of D: an `ingress` rule S -> D-on-this-node;
    each NIC also gets `established` allows (conntrack return) and a final deny in both directions;
  - on the leaf of every node hosting part of S: an ACL rule S-on-this-leaf -> D in the source tenant's
    ACL; on the leaf of every node hosting part of D: a stateless return rule D-on-this-leaf (source port
    = the service ports) -> the source tenants' prefixes in the destination tenant's ACL. Every ACL ends in
    a deny;
  - across tenants (grants, platform services), route leaking of exactly the needed prefixes: the source
    tenant's VRF imports D's addresses from the destination VRF on the source leaves, and the destination
    VRF imports the source group's addresses back on the destination leaves.
Aggregation: addresses are collapsed into prefixes; rules with equal match but different reasons become
one rule carrying both reasons; a rule whose ports another rule with the same match already covers is
dropped (shadowed) and its reason moves to the covering rule.

Incremental: `recompile(previous, allowed, revoked)` redoes only the entries that changed (and those whose
groups gained or lost a revoked workload) and reassembles only the devices they touch.
"""

from __future__ import annotations

import bisect
import gc
import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from enforcer.cost import leaf_rule_cost, nic_fixed_cost, nic_rule_cost, set_sizes
from enforcer.errors import BudgetExceeded, Overflow
from enforcer.fabric import PROTOS, Fabric, Placement
from enforcer.ir import (
    ANY,
    PRIO_ALLOW,
    PRIO_DENY,
    PRIO_ESTABLISHED,
    AddressSet,
    DeviceRuleSet,
    FlowRule,
    Leak,
    Port,
    Vrf,
    merge_ranges,
    range_covers,
)

CONNTRACK_RETURN = "conntrack-return"
DEFAULT_DENY = "default-deny"


@dataclass(frozen=True)
class Budget:
    """Per-device capacity. NVUE's atomic ACL update mode keeps a shadow copy, halving usable entries."""

    nic_flows: int = 65_536
    leaf_acl_entries: int = 36_000
    acl_mode: str = "atomic"  # "atomic" | "non-atomic"

    def limit(self, kind: str) -> int:
        if kind == "nic":
            return self.nic_flows
        return self.leaf_acl_entries // 2 if self.acl_mode == "atomic" else self.leaf_acl_entries


@dataclass(frozen=True)
class Entry:
    """One element of allowed_flows, normalised (ports merged into ranges, sources sorted)."""

    dst: str  # tenant/group
    proto: str
    reason: str
    ports: tuple[tuple[int, int], ...]
    sources: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dst, self.proto, self.reason)

    @property
    def dst_tenant(self) -> str:
        return self.dst.split("/", 1)[0]


Known = dict[tuple[Any, ...], tuple[Any, "Entry"]]  # (dst_tenant, dst_group, proto, reason) -> (item, entry)


def parse_entries(raw: Any, known: Known | None = None
                  ) -> tuple[dict[tuple[str, str, str], Entry], Known, set[tuple[str, str, str]]]:
    """The compact allowed_flows set, validated (InvalidInput naming a malformed entry); with, for the next
    call, each item as given, and the keys parsed afresh. An item equal to the one `known` holds for it reuses
    that entry unparsed (items are compared, not copied: a caller must not mutate them afterwards)."""
    if not isinstance(raw, list):
        raise InvalidInput("data.flows.allowed_flows is undefined or not a set of flow entries")
    out: dict[tuple[str, str, str], Entry] = {}
    seen: Known = {}
    fresh: set[tuple[str, str, str]] = set()
    for item in raw:
        try:
            rk = (item["dst_tenant"], item["dst_group"], item["proto"], item["reason"])
            if known is not None:
                hit = known.get(rk)
                if hit is not None and (hit[0] is item or hit[0] == item) and hit[1].key not in out:
                    out[hit[1].key] = hit[1]
                    seen[rk] = hit
                    continue
            dst = f"{item['dst_tenant']}/{item['dst_group']}"
            proto, reason = str(item["proto"]), str(item["reason"])
            if proto not in PROTOS:
                raise ValueError(f"proto {proto!r}")
            ports = []
            for p in item["ports"]:
                if isinstance(p, bool) or not isinstance(p, int | float) or p != int(p) or not 1 <= p <= 65535:
                    raise ValueError(f"port {p!r} is not an integer 1-65535")
                ports.append(int(p))
            sources = tuple(sorted({str(s) for s in item["sources"]}))
            if any(s.count("/") != 1 for s in sources):
                raise ValueError("sources must be tenant/group")
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"data.flows.allowed_flows has a malformed entry {item!r:.200}: {exc}") from None
        e = Entry(dst, proto, reason, merge_ranges([(p, p) for p in ports]), sources)
        prev = out.get(e.key)
        if prev is not None:  # the same key twice: one entry with the union, never reused unparsed
            e = Entry(dst, proto, reason, merge_ranges(prev.ports + e.ports),
                      tuple(sorted(set(prev.sources) | set(e.sources))))
            seen = {k: v for k, v in seen.items() if v[1].key != e.key}
        else:
            seen[rk] = (item, e)
        out[e.key] = e
        fresh.add(e.key)
    return out, seen, fresh


# ---------------------------------------------------------------- the fabric, indexed for one compile

class _Context:
    """Membership and addresses under one fabric and one revoked set (never mutated after build)."""

    def __init__(self, fabric: Fabric, revoked: frozenset[str]) -> None:
        self.fabric = fabric
        ids = fabric.spiffe_ids()
        self.revoked_ids = revoked | frozenset(ids[w.key] for w in fabric.workloads if w.revoked)
        self.revoked_workloads = frozenset(k for k, sid in ids.items() if sid in self.revoked_ids)
        self.leaf_of = {n: a.leaf for n, a in fabric.attachment.items()}
        self.members: dict[str, tuple[Placement, ...]] = {
            g: tuple(p for p in ps if p.workload not in self.revoked_workloads and p.workload in fabric.workload)
            for g, ps in fabric.members.items()}
        self._prefixes: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._single: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # addresses as integers, and the text of each, so collapsing never parses a string twice
        self.ints: dict[str, tuple[int | None, int | None]] = {}
        self.text: dict[tuple[int, int], str] = {}
        for p in fabric.placements:
            a4 = int(ipaddress.IPv4Address(p.ipv4)) if p.ipv4 else None
            a6 = int(ipaddress.IPv6Address(p.ipv6)) if p.ipv6 else None
            self.ints[p.workload] = (a4, a6)
            if a4 is not None:
                self.text[(4, a4)] = str(p.ipv4)
            if a6 is not None:
                self.text[(6, a6)] = str(ipaddress.IPv6Address(a6))

    def addresses(self, placements: Sequence[Placement]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The placements' addresses as collapsed CIDRs per family (what ipaddress.collapse_addresses gives)."""
        if len(placements) == 1:
            p = placements[0]
            one = self._single.get(p.workload)
            if one is None:
                a6 = self.ints[p.workload][1]
                one = self._single[p.workload] = ((f"{p.ipv4}/32",) if p.ipv4 else (),
                                                  (f"{self.text[(6, a6)]}/128",) if a6 is not None else ())
            return one
        v4: list[int] = []
        v6: list[int] = []
        for p in placements:
            a4, a6 = self.ints[p.workload]
            if a4 is not None:
                v4.append(a4)
            if a6 is not None:
                v6.append(a6)
        return self._collapse(v4, 4), self._collapse(v6, 6)

    def _collapse(self, ints: list[int], family: int) -> tuple[str, ...]:
        if not ints:
            return ()
        if len(ints) == 1:
            return (f"{self.text[(family, ints[0])]}/{32 if family == 4 else 128}",)
        bits = 32 if family == 4 else 128
        xs = sorted(set(ints))
        out: list[str] = []
        start = prev = xs[0]
        for x in [*xs[1:], -2]:
            if x == prev + 1:
                prev = x
                continue
            lo = start
            while lo <= prev:  # the largest aligned block at lo that stays within [lo, prev]
                size = lo & -lo if lo else 1 << bits
                while size > prev - lo + 1:
                    size >>= 1
                text = self.text.get((family, lo))
                if text is None:
                    text = str(ipaddress.IPv4Address(lo) if family == 4 else ipaddress.IPv6Address(lo))
                out.append(f"{text}/{bits - size.bit_length() + 1}")
                lo += size
            start = prev = x
        return tuple(out)

    def tenant_prefixes(self, tenants: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        key = tuple(tenants)
        hit = self._prefixes.get(key)
        if hit is None:
            hit = self._prefixes[key] = self._tenant_prefixes(key)
        return hit

    def _tenant_prefixes(self, tenants: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        nets = [n for t in tenants for n in self.fabric.tenant[t].networks()]
        v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
        v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
        return (tuple(str(n) for n in ipaddress.collapse_addresses(v4)),
                tuple(str(n) for n in ipaddress.collapse_addresses(v6)))


# One entry's contribution: per device, rule tuples and leaks, and the sets they name.
RuleT = tuple[str, str, str, str, str, str, tuple[tuple[int, int], ...], str]
#            direction scope src dst proto port_side ports reason  (sorted, this is the evaluation order)
LeakT = tuple[str, str, str, str]  # importing tenant, prefix, from tenant, reason


@dataclass
class _Contribution:
    rules: dict[str, list[RuleT]] = field(default_factory=dict)
    leaks: dict[str, list[LeakT]] = field(default_factory=dict)
    sets: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = field(default_factory=dict)  # per device

    def devices(self) -> set[str]:
        return set(self.rules) | set(self.leaks)


def _contribute(e: Entry, ctx: _Context) -> _Contribution:
    out = _Contribution()
    dmem = ctx.members.get(e.dst, ())
    smem_by = {s: ctx.members.get(s, ()) for s in e.sources}
    smem = [p for s in e.sources for p in smem_by[s]]
    if not dmem or not smem:
        return out
    dt = e.dst_tenant
    src_tenants = sorted({s.split("/", 1)[0] for s in e.sources if smem_by[s]})
    src_name = e.sources[0] if len(e.sources) == 1 else f"src:{e.dst}:{e.proto}:{e.reason}"
    dst_name = e.dst
    dst_addrs = ctx.addresses(dmem)
    tenants_name = f"tenants:{src_tenants[0]}" if len(src_tenants) == 1 else f"tenants:{src_name}"
    leaf_of = ctx.leaf_of
    src_all: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    by_tenant: dict[str, list[Placement]] | None = None

    def add(device: str, rule: RuleT, name_a: str, addrs_a: tuple[tuple[str, ...], tuple[str, ...]], name_b: str,
            addrs_b: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
        out.rules.setdefault(device, []).append(rule)
        sets = out.sets.get(device)
        if sets is None:
            sets = out.sets[device] = {}
        sets[name_a] = addrs_a
        sets[name_b] = addrs_b

    # SuperNIC egress (sources on this node) and leaf forward rules (sources on this leaf, per tenant)
    by_node: dict[str, list[Placement]] = {}
    by_leaf: dict[tuple[str, str], list[Placement]] = {}
    for p in smem:
        by_node.setdefault(p.node, []).append(p)
        by_leaf.setdefault((leaf_of[p.node], p.workload.split("/", 1)[0]), []).append(p)
    for node, ps in by_node.items():
        name = f"{src_name}@{node}"
        add(f"nic:{node}", ("egress", "", name, dst_name, e.proto, "dst", e.ports, e.reason),
            name, ctx.addresses(ps), dst_name, dst_addrs)
    for (leaf, ts), ps in by_leaf.items():
        name = f"{src_name}@{leaf}" if len(src_tenants) == 1 else f"{src_name}@{leaf}/{ts}"
        add(f"leaf:{leaf}", ("inbound", ts, name, dst_name, e.proto, "dst", e.ports, e.reason),
            name, ctx.addresses(ps), dst_name, dst_addrs)
        if ts != dt:
            for prefix in _flat(dst_addrs):
                out.leaks.setdefault(f"leaf:{leaf}", []).append((ts, prefix, dt, e.reason))
    # SuperNIC ingress (destinations on this node) and leaf return rules (destinations on this leaf)
    d_by_node: dict[str, list[Placement]] = {}
    d_by_leaf: dict[str, list[Placement]] = {}
    for p in dmem:
        d_by_node.setdefault(p.node, []).append(p)
        d_by_leaf.setdefault(leaf_of[p.node], []).append(p)
    for node, ps in d_by_node.items():
        name = f"{dst_name}@{node}"
        if src_all is None:
            src_all = ctx.addresses(smem)
        add(f"nic:{node}", ("ingress", "", src_name, name, e.proto, "dst", e.ports, e.reason),
            name, ctx.addresses(ps), src_name, src_all)
    tenant_prefixes = ctx.tenant_prefixes(src_tenants)
    for leaf, ps in d_by_leaf.items():
        name = f"{dst_name}@{leaf}"
        add(f"leaf:{leaf}", ("inbound", dt, name, tenants_name, e.proto, "src", e.ports, e.reason),
            name, ctx.addresses(ps), tenants_name, tenant_prefixes)
        if by_tenant is None:
            by_tenant = {}
            for p in smem:
                by_tenant.setdefault(p.workload.split("/", 1)[0], []).append(p)
        for ts in src_tenants:
            if ts == dt:
                continue
            for prefix in _flat(ctx.addresses(by_tenant[ts])):
                out.leaks.setdefault(f"leaf:{leaf}", []).append((dt, prefix, ts, e.reason))
    return out


def _flat(v46: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[str, ...]:
    return v46[0] + v46[1]


# ---------------------------------------------------------------- device assembly

def _aggregate_group(group: Sequence[RuleT]) -> list[FlowRule]:
    """One match's allow rules (raw rules sharing direction, scope, sets, proto and port side): equal
    ports merge their reasons; ports another rule covers are dropped (shadowed), the reason moving over."""
    direction, scope, src, dst, proto, side = group[0][:6]
    state = "new" if direction != "inbound" else "any"
    if len(group) == 1:  # the common case: nothing to merge or shadow
        r = group[0]
        return [FlowRule(PRIO_ALLOW, direction, scope, src, dst, proto, r[6], side, state, "allow", (r[7],))]
    by_ports: dict[tuple[tuple[int, int], ...], set[str]] = {}
    for x in group:
        by_ports.setdefault(x[6], set()).add(x[7])
    items = sorted(by_ports.items(), key=lambda kv: (-sum(b - a + 1 for a, b in kv[0]), kv[0]))
    kept: list[tuple[tuple[tuple[int, int], ...], set[str]]] = []
    for ports, reasons in items:
        cover = next((k for k in kept if range_covers(k[0], ports)), None)
        if cover is not None:
            cover[1].update(reasons)
        else:
            kept.append((ports, set(reasons)))
    return [FlowRule(PRIO_ALLOW, direction, scope, src, dst, proto, ports, side, state, "allow",
                     tuple(sorted(reasons))) for ports, reasons in sorted(kept, key=lambda k: k[0])]


def _nic_ports(fabric: Fabric, node: str) -> tuple[Port, ...]:
    out = []
    for p in fabric.placements_on.get(node, ()):
        if p.workload not in fabric.workload:
            continue
        t = fabric.tenant[p.workload.split("/", 1)[0]]
        out.append(Port(p.port, t.slug, t.vlan, node, p.workload, (f"{p.ipv4}/32",) if p.ipv4 else (),
                        (f"{p.ipv6}/128",) if p.ipv6 else ()))
    return tuple(sorted(out))


def _leaf_ports(fabric: Fabric, leaf: str) -> tuple[Port, ...]:
    out = set()
    for node in fabric.nodes_under.get(leaf, ()):
        att = fabric.attachment[node]
        for p in fabric.placements_on.get(node, ()):
            if p.workload not in fabric.workload:
                continue
            t = fabric.tenant[p.workload.split("/", 1)[0]]
            out.add(Port(f"{att.leaf_port}.{t.vlan}", t.slug, t.vlan, node, base=att.leaf_port))
    return tuple(sorted(out))


Sets = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


@dataclass
class _DevState:
    """What a device's rule set is assembled from, kept so a recompile patches it instead of redoing it."""

    raw: list[RuleT]  # every entry's raw allow rules, sorted (= evaluation order)
    agg: dict[tuple[str, ...], list[FlowRule]]  # match -> its aggregated rules
    keys: list[tuple[str, ...]]  # the matches, sorted
    leaks: dict[str, dict[tuple[str, str], dict[str, int]]]  # into -> (prefix, from) -> reason -> count
    vrf_leaks: dict[str, tuple[Leak, ...]]
    sets: Sets
    set_objs: dict[str, AddressSet]

    def copy(self) -> _DevState:
        return _DevState(list(self.raw), dict(self.agg), list(self.keys), dict(self.leaks), dict(self.vrf_leaks),
                         dict(self.sets), dict(self.set_objs))


def _state(device: str, contribs: Sequence[_Contribution]) -> _DevState:
    raw: list[RuleT] = []
    leaks: dict[str, dict[tuple[str, str], dict[str, int]]] = {}
    sets: Sets = {}
    for c in contribs:
        raw.extend(c.rules.get(device, ()))
        for into, prefix, frm, reason in c.leaks.get(device, ()):
            counts = leaks.setdefault(into, {}).setdefault((prefix, frm), {})
            counts[reason] = counts.get(reason, 0) + 1
        sets.update(c.sets.get(device, {}))
    raw.sort()
    agg: dict[tuple[str, ...], list[FlowRule]] = {}
    i, n = 0, len(raw)
    while i < n:
        key = raw[i][:6]
        j = i + 1
        while j < n and raw[j][:6] == key:
            j += 1
        agg[key] = _aggregate_group(raw[i:j])
        i = j
    st = _DevState(raw, agg, list(agg), leaks, {}, sets, {})
    for into in leaks:
        st.vrf_leaks[into] = _leak_tuple(leaks[into])
    return st


def _leak_tuple(by: dict[tuple[str, str], dict[str, int]]) -> tuple[Leak, ...]:
    """(prefix, from tenant) -> reasons, as Leaks whose from_vrf is still the tenant (named in _finish)."""
    return tuple(sorted(Leak(prefix, frm, tuple(sorted(rs))) for (prefix, frm), rs in by.items()))


def _patch(st: _DevState, device: str, old: _Contribution | None, new: _Contribution | None) -> None:
    """Replace one entry's contribution to a device in its state."""
    dirty: set[tuple[str, ...]] = set()
    intos: set[str] = set()
    for r in (old.rules.get(device, ()) if old else ()):
        i = bisect.bisect_left(st.raw, r)
        if i == len(st.raw) or st.raw[i] != r:
            raise RuntimeError(f"{device}: state lost a rule of the previous compile: {r}")
        del st.raw[i]
        dirty.add(r[:6])
    for r in (new.rules.get(device, ()) if new else ()):
        bisect.insort(st.raw, r)
        dirty.add(r[:6])
    for c, step in ((old, -1), (new, 1)):
        for into, prefix, frm, reason in (c.leaks.get(device, ()) if c else ()):
            by = st.leaks[into] = dict(st.leaks.get(into, {})) if into not in intos else st.leaks[into]
            intos.add(into)
            counts = by[(prefix, frm)] = dict(by.get((prefix, frm), {}))
            counts[reason] = counts.get(reason, 0) + step
            if counts[reason] <= 0:
                del counts[reason]
            if not counts:
                del by[(prefix, frm)]
    for into in intos:
        if st.leaks[into]:
            st.vrf_leaks[into] = _leak_tuple(st.leaks[into])
        else:
            del st.leaks[into]
            st.vrf_leaks.pop(into, None)
    if new is not None:
        st.sets.update(new.sets.get(device, {}))
    for key in dirty:
        lo = bisect.bisect_left(st.raw, key)
        hi = lo
        while hi < len(st.raw) and st.raw[hi][:6] == key:
            hi += 1
        if hi > lo:
            if key not in st.agg:
                bisect.insort(st.keys, key)
            st.agg[key] = _aggregate_group(st.raw[lo:hi])
        elif key in st.agg:
            del st.agg[key]
            del st.keys[bisect.bisect_left(st.keys, key)]


def _finish(device: str, fabric: Fabric, st: _DevState) -> DeviceRuleSet:
    kind, name = device.split(":", 1)
    allows = [r for k in st.keys for r in st.agg[k]]  # in evaluation order (rule_order)
    if kind == "nic":
        ports = _nic_ports(fabric, name)
        rules = [FlowRule(PRIO_ESTABLISHED, d, "", ANY, ANY, "*", (), "dst", "established", "allow",
                          (CONNTRACK_RETURN,)) for d in ("egress", "ingress")]
        rules += allows
        rules += [FlowRule(PRIO_DENY, d, "", ANY, ANY, "*", (), "dst", "new", "deny", (DEFAULT_DENY,))
                  for d in ("egress", "ingress")]
        vrfs: tuple[Vrf, ...] = ()
        uplink = fabric.attachment[name].uplink if name in fabric.attachment else ""
    else:
        ports = _leaf_ports(fabric, name)
        rules = allows + [FlowRule(PRIO_DENY, "inbound", tenant, ANY, ANY, "*", (), "dst", "any", "deny",
                                   (DEFAULT_DENY,)) for tenant in sorted({p.tenant for p in ports})]
        vrfs = _vrfs(fabric, ports, st.vrf_leaks)
        uplink = ""
    used = {r.src for r in rules} | {r.dst for r in rules}
    used.discard(ANY)
    objs = []
    for n in sorted(used):
        content = st.sets[n]
        obj = st.set_objs.get(n)
        if obj is None or (obj.v4, obj.v6) != content:
            obj = st.set_objs[n] = AddressSet(n, *content)
        objs.append(obj)
    sizes = {s.name: (len(s.v4), len(s.v6)) for s in objs}
    if kind == "nic":
        cost = nic_fixed_cost(ports) + sum(nic_rule_cost(r, sizes) for r in rules)
    else:
        cost = sum(leaf_rule_cost(r, sizes) for r in rules)
    return DeviceRuleSet(device, kind, uplink, ports, tuple(objs), tuple(rules), vrfs, cost)


def _vrfs(fabric: Fabric, ports: tuple[Port, ...], vrf_leaks: Mapping[str, tuple[Leak, ...]]) -> tuple[Vrf, ...]:
    members: dict[str, list[str]] = {}
    for p in ports:
        members.setdefault(p.tenant, []).append(p.name)
    for into, leaks in vrf_leaks.items():  # a leak's source VRF must exist on this leaf (EVPN type-5 routes)
        members.setdefault(into, [])
        for lk in leaks:
            members.setdefault(lk.from_vrf, [])
    out = []
    for slug in sorted(members):
        t = fabric.tenant[slug]
        named = tuple(Leak(x.prefix, fabric.tenant[x.from_vrf].vrf, x.reasons) for x in vrf_leaks.get(slug, ()))
        out.append(Vrf(t.vrf, slug, t.vni, tuple(sorted(members[slug])), t.prefixes, named))
    return tuple(out)


# ---------------------------------------------------------------- compile results

@dataclass
class Compiled:
    """A whole compile: every device's rule set, plus what an incremental recompile reuses."""

    fabric: Fabric
    revoked: frozenset[str]
    budget: Budget
    entries: dict[tuple[str, str, str], Entry]
    devices: dict[str, DeviceRuleSet]
    contributions: dict[tuple[str, str, str], _Contribution] = field(repr=False)
    by_device: dict[str, set[tuple[str, str, str]]] = field(repr=False)
    states: dict[str, _DevState] = field(default_factory=dict, repr=False)
    known: Known = field(default_factory=dict, repr=False)  # what parse_entries reuses next time
    ctx: Any = field(default=None, repr=False)
    recompiled: tuple[str, ...] = ()  # the devices this (re)compile assembled
    changed: tuple[str, ...] = ()  # of those, the ones whose rule set differs from the previous compile

    def device_hashes(self) -> dict[str, str]:
        return {d: rs.content_hash for d, rs in sorted(self.devices.items())}


def all_devices(fabric: Fabric) -> list[str]:
    return [f"nic:{n.name}" for n in fabric.nodes] + [f"leaf:{s.name}" for s in fabric.leaves]


def compile_fabric(fabric: Fabric, allowed: Any, revoked: Iterable[str] = (), budget: Budget | None = None
                   ) -> Compiled:
    """Every device's rule set; InvalidInput for a malformed allowed_flows, BudgetExceeded when a device
    would overflow (naming its largest contributors)."""
    budget = budget or Budget()
    rev = frozenset(revoked)
    with _no_gc():
        return _compile(fabric, allowed, rev, budget)


@contextmanager
def _no_gc() -> Iterator[None]:
    """A compile allocates millions of acyclic objects: the cyclic collector only slows it down."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _compile(fabric: Fabric, allowed: Any, rev: frozenset[str], budget: Budget) -> Compiled:
    ctx = _Context(fabric, rev)
    entries, known, _ = parse_entries(allowed)
    contributions = {k: _contribute(e, ctx) for k, e in entries.items()}
    by_device: dict[str, set[tuple[str, str, str]]] = {d: set() for d in all_devices(fabric)}
    for k, c in contributions.items():
        for d in c.devices():
            by_device.setdefault(d, set()).add(k)
    states = {d: _state(d, [contributions[k] for k in ks]) for d, ks in by_device.items()}
    devices = {d: _finish(d, fabric, st) for d, st in states.items()}
    _check_budget(devices, budget)
    names = tuple(sorted(devices))
    return Compiled(fabric, rev, budget, entries, devices, contributions, by_device, states, known, ctx, names,
                    names)


def recompile(prev: Compiled, allowed: Any, revoked: Iterable[str] | None = None) -> Compiled:
    """The compile of (prev.fabric, allowed, revoked), redoing only what changed; `recompiled` names the
    devices reassembled and `changed` those whose rule set differs. A fabric change needs compile_fabric."""
    with _no_gc():
        return _recompile(prev, allowed, revoked)


def _recompile(prev: Compiled, allowed: Any, revoked: Iterable[str] | None) -> Compiled:
    rev = prev.revoked if revoked is None else frozenset(revoked)
    entries, known, fresh = parse_entries(allowed, prev.known)
    dirty = {k for k in fresh if entries[k] != prev.entries.get(k)} | (prev.entries.keys() - entries.keys())
    ctx = prev.ctx if rev == prev.revoked and prev.ctx is not None else _Context(prev.fabric, rev)
    if rev != prev.revoked:
        old = prev.ctx or _Context(prev.fabric, prev.revoked)
        groups = {"/".join(w.split("/")[:2]) for w in ctx.revoked_workloads ^ old.revoked_workloads}
        dirty |= {k for k, e in entries.items() if e.dst in groups or groups.intersection(e.sources)}
    contributions = dict(prev.contributions)
    by_device = dict(prev.by_device)
    states = dict(prev.states)
    touched: set[str] = set()
    for k in sorted(dirty):
        old_c = contributions.pop(k, None)
        new_c = _contribute(entries[k], ctx) if k in entries else None
        if new_c is not None:
            contributions[k] = new_c
        for d in (old_c.devices() if old_c else set()) | (new_c.devices() if new_c else set()):
            if d not in touched:
                touched.add(d)
                states[d] = states[d].copy()  # the previous compile stays valid
                by_device[d] = set(by_device[d])
            _patch(states[d], d, old_c, new_c)
            if new_c is not None and d in new_c.devices():
                by_device[d].add(k)
            else:
                by_device[d].discard(k)
    devices = dict(prev.devices)
    for d in touched:
        devices[d] = _finish(d, prev.fabric, states[d])
    _check_budget({d: devices[d] for d in touched}, prev.budget)
    changed = tuple(sorted(d for d in touched if devices[d] != prev.devices[d]))
    return Compiled(prev.fabric, rev, prev.budget, entries, devices, contributions, by_device, states, known, ctx,
                    tuple(sorted(touched)), changed)


def contributors(rs: DeviceRuleSet) -> list[tuple[str, int]]:
    """Budget use per reason on one device, largest first (a rule with several reasons counts for each)."""
    sizes = set_sizes(rs.sets)
    cost = nic_rule_cost if rs.kind == "nic" else leaf_rule_cost
    use: dict[str, int] = {}
    for r in rs.rules:
        for reason in r.reasons:
            use[reason] = use.get(reason, 0) + cost(r, sizes)
    return sorted(use.items(), key=lambda kv: (-kv[1], kv[0]))


def _check_budget(devices: Mapping[str, DeviceRuleSet], budget: Budget) -> None:
    over = []
    for d in sorted(devices):
        rs = devices[d]
        limit = budget.limit(rs.kind)
        if rs.cost > limit:
            what = "NIC flows" if rs.kind == "nic" else "switch ACL entries"
            over.append(Overflow(d, what, rs.cost, limit, tuple(contributors(rs)[:5])))
    if over:
        raise BudgetExceeded(over)
