"""Proof that the compiled rule sets do what the policy says, flow by flow.

Each flow (source workload, destination workload, protocol, port class) is walked the way the packets go:
source SuperNIC egress (first match by priority; a new connection is committed to conntrack in the source
tenant's zone) -> source leaf, inbound ACL of the source tenant's attachment (stateless, first match) ->
VRF lookup on the source leaf (own prefixes or a leaked route, longest prefix wins; the route must lead
into the destination tenant's VRF, which must reach the destination's attachment) -> destination
SuperNIC ingress (committed in the destination tenant's zone); then the reply back: destination NIC egress
(must be admitted as `established`), destination leaf ACL (a stateless return rule), the VRF lookup back,
source NIC ingress (`established`). The devices' answer is allow only if every step passes.

RoCEv2 (UDP to port 4791) skips conntrack on the NICs: its packets go both ways to 4791 from a varying source
port, so it is walked as two one-way trips, source -> destination and destination -> source, each through the
source NIC's `stateless` egress rules, the source leaf's ACL, the VRF lookup and the destination NIC's
`stateless` ingress rules (a NIC's stateless rule admits its mirror too). Such an allowance is symmetric by
construction, so the policy's answer for RoCEv2 between two groups is: allowed in either direction.

Port classes are the intervals between every port boundary the policy or any rule mentions, so one port
per class decides for the whole class. The policy's answer comes from `policy.decide.expand_allowed` over
the same compact allowed_flows the compiler read, minus revoked workloads.

`verify(..., exhaustive=True)` walks every ordered pair of placed workloads (tests); the default walks the
flows that any NIC egress rule could admit plus every flow the policy allows: any other flow meets the
egress default deny first, so the answer is the same and the work stays proportional to the allowed set.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from core.rocev2 import ROCE_V2_PORT, is_rocev2
from enforcer.compiler import Compiled
from enforcer.fabric import Fabric, Placement
from enforcer.ir import ANY, STATELESS, DeviceRuleSet, FlowRule
from policy.decide import Flow, expand_allowed

EPHEMERAL_PORT = 49_152


@dataclass(frozen=True, order=True)
class Mismatch:
    src: str  # workload key
    dst: str
    proto: str
    port: int  # the first port of the class
    family: int
    policy: bool  # the policy's answer
    devices: bool  # what the rule sets do
    detail: str  # where the devices decided

    def __str__(self) -> str:
        word = {True: "allow", False: "deny"}
        return (f"{self.src} -> {self.dst} {self.proto}/{self.port} (IPv{self.family}): policy says "
                f"{word[self.policy]}, devices {word[self.devices]} ({self.detail})")


@cache
def _cidr(text: str) -> tuple[int, int, int, int]:
    """(version, first, last, prefix length) of a CIDR; cached: the same addresses recur on many devices."""
    addr, _, plen = text.partition("/")
    if ":" not in addr:
        a, b, c, d = (int(x) for x in addr.split("."))
        length = int(plen) if plen else 32
        start = (a << 24) | (b << 16) | (c << 8) | d
        return 4, start, start | ((1 << (32 - length)) - 1), length
    n = ipaddress.ip_network(text)
    return 6, int(n.network_address), int(n.broadcast_address), n.prefixlen


class _NetSet:
    """CIDRs as sorted integer intervals per family, for fast membership."""

    def __init__(self, cidrs: Iterable[str]) -> None:
        spans: dict[int, list[tuple[int, int]]] = {4: [], 6: []}
        for c in cidrs:
            fam, first, last, _ = _cidr(c)
            spans[fam].append((first, last))
        self.starts: dict[int, list[int]] = {}
        self.ends: dict[int, list[int]] = {}
        for fam, s in spans.items():
            s.sort()
            self.starts[fam] = [a for a, _ in s]
            self.ends[fam] = [b for _, b in s]

    def __contains__(self, addr: tuple[int, int]) -> bool:
        fam, value = addr
        starts = self.starts[fam]
        i = bisect.bisect_right(starts, value) - 1
        return i >= 0 and value <= self.ends[fam][i]


class _AnySet:
    def __contains__(self, addr: tuple[int, int]) -> bool:
        return True


_ANY = _AnySet()
Match = tuple[FlowRule, Any, Any]


LOCAL_SIDE = {"egress": "src", "inbound": "src", "ingress": "dst"}  # the side that holds this device's own
OTHER = {"egress": "ingress", "ingress": "egress"}
ROCE_NOTE = "RoCEv2, udp/4791: no conntrack, allowed both ways"


class _Device:
    """One device's rules, indexed by the address on the local side of each chain (a NIC's or leaf's own
    workloads), so a lookup scans only the rules that can match, still in evaluation order."""

    def __init__(self, rs: DeviceRuleSet) -> None:
        self.rs = rs
        sets = {s.name: _NetSet(s.v4 + s.v6) for s in rs.sets}
        members = {s.name: s.v4 + s.v6 for s in rs.sets}
        self.index: dict[tuple[str, str], tuple[dict[tuple[int, int], list[tuple[int, Match]]],
                                                list[tuple[int, Match]]]] = {}
        def put(pos: int, direction: str, r: FlowRule, src_name: str, dst_name: str) -> None:
            src = _ANY if src_name == ANY else sets[src_name]
            dst = _ANY if dst_name == ANY else sets[dst_name]
            by_addr, always = self.index.setdefault((direction, r.scope), ({}, []))
            local = src_name if LOCAL_SIDE[direction] == "src" else dst_name
            item = (pos, (r, src, dst))
            addrs = _expand(members[local]) if local != ANY else None
            if addrs is None:
                always.append(item)
            else:
                for a in addrs:
                    by_addr.setdefault(a, []).append(item)

        for pos, r in enumerate(rs.rules):  # already in evaluation order
            put(pos, r.direction, r, r.src, r.dst)
            if r.state == STATELESS and r.action == "allow":  # and its mirror, in the other direction
                put(pos, OTHER[r.direction], r, r.dst, r.src)
        self._merged: dict[tuple[str, str, tuple[int, int]], list[Match]] = {}
        self.vrfs = {v.tenant: v for v in rs.vrfs}
        # per VRF: (version, prefix length, network) -> the tenant VRF it leads into, and the lengths present
        self.routes: dict[str, tuple[dict[tuple[int, int, int], str], dict[int, list[int]]]] = {}
        vrf_tenant = {v.name: v.tenant for v in rs.vrfs}
        for v in rs.vrfs:
            table: dict[tuple[int, int, int], str] = {}
            lengths: dict[int, set[int]] = {4: set(), 6: set()}
            for prefix, into in [(p, v.tenant) for p in v.prefixes] + [
                    (lk.prefix, vrf_tenant.get(lk.from_vrf, "?")) for lk in v.leaks]:
                fam, first, _, plen = _cidr(prefix)
                table[(fam, plen, first)] = into
                lengths[fam].add(plen)
            self.routes[v.tenant] = (table, {f: sorted(ls, reverse=True) for f, ls in lengths.items()})
        self.members = {(p.node, p.tenant) for p in rs.ports}

    def _chain(self, chain: tuple[str, str], local: tuple[int, int]) -> list[Match]:
        key = (*chain, local)
        hit = self._merged.get(key)
        if hit is None:
            by_addr, always = self.index.get(chain, ({}, []))
            hit = self._merged[key] = [m for _, m in sorted(by_addr.get(local, []) + always, key=lambda x: x[0])]
        return hit

    def first(self, chain: tuple[str, str], state: str, src: tuple[int, int], dst: tuple[int, int], proto: str,
              sport: int, dport: int) -> FlowRule | None:
        local = src if LOCAL_SIDE[chain[0]] == "src" else dst
        for r, s, d in self._chain(chain, local):
            if r.state not in ("any", state):
                continue
            if r.proto not in ("*", proto) or src not in s or dst not in d:
                continue
            port = sport if r.port_side == "src" else dport
            if r.ports and not any(lo <= port <= hi for lo, hi in r.ports):
                continue
            return r
        return None

    def route(self, tenant: str, dst: tuple[int, int]) -> str | None:
        """The tenant VRF the lookup in `tenant`'s VRF forwards into (longest prefix), or None (no route)."""
        routes = self.routes.get(tenant)
        if routes is None:
            return None
        table, lengths = routes
        fam, value = dst
        bits = 32 if fam == 4 else 128
        for plen in lengths[fam]:
            into = table.get((fam, plen, value >> (bits - plen) << (bits - plen)))
            if into is not None:
                return into
        return None


def _expand(cidrs: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """Every address of small CIDRs (a device's own workloads); None when one is too large to list."""
    out: list[tuple[int, int]] = []
    for c in cidrs:
        fam, first, last, _ = _cidr(c)
        if last - first >= 256:
            return None
        out.extend((fam, a) for a in range(first, last + 1))
    return out


def _addr(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    a = ipaddress.ip_address(text)
    return (a.version, int(a))


class RuleSets(Protocol):
    """A fabric and a rule set per device: a compile, or the rule sets a lab's devices run."""

    @property
    def fabric(self) -> Fabric: ...

    @property
    def devices(self) -> Mapping[str, DeviceRuleSet]: ...


class Walker:
    """Walks flows through one compile's rule sets (or any fabric's rule sets per device)."""

    def __init__(self, compiled: RuleSets) -> None:
        self.c = compiled
        self.fabric = compiled.fabric
        self._devices: dict[str, _Device] = {}
        self._addrs: dict[tuple[str, int], tuple[int, int] | None] = {}

    def device(self, name: str) -> _Device:
        d = self._devices.get(name)
        if d is None:
            d = self._devices[name] = _Device(self.c.devices[name])
        return d

    def _a(self, p: Placement, family: int) -> tuple[int, int] | None:
        key = (p.workload, family)
        if key not in self._addrs:
            self._addrs[key] = _addr(p.ipv4 if family == 4 else p.ipv6)
        return self._addrs[key]

    def walk(self, s: Placement, d: Placement, family: int, proto: str, port: int, explain: bool = True
             ) -> tuple[bool, str]:
        sa = self._a(s, family)
        da = self._a(d, family)
        if sa is None or da is None:
            return False, "no address of this family"
        ts, td = s.workload.split("/", 1)[0], d.workload.split("/", 1)[0]
        att = self.fabric.attachment
        ls, ld = att[s.node].leaf, att[d.node].leaf
        nic_s, nic_d = self.device(f"nic:{s.node}"), self.device(f"nic:{d.node}")
        leaf_s, leaf_d = self.device(f"leaf:{ls}"), self.device(f"leaf:{ld}")
        eph = EPHEMERAL_PORT
        if is_rocev2(proto, port):
            return self._walk_roce(s, d, sa, da, explain)
        steps: list[tuple[str, FlowRule | None]] = [
            (f"nic:{s.node} egress", nic_s.first(("egress", ""), "new", sa, da, proto, eph, port))]
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        steps.append((f"leaf:{ls} acl {ts}", leaf_s.first(("inbound", ts), "any", sa, da, proto, eph, port)
                      if (s.node, ts) in leaf_s.members else None))
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        ok, why = self._route(leaf_s, leaf_d, ts, td, da, d)
        if not ok:
            return False, f"leaf:{ls} vrf {ts}: {why}"
        steps.append((f"nic:{d.node} ingress", nic_d.first(("ingress", ""), "new", sa, da, proto, eph, port)))
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        # the reply: committed connections on both NICs, stateless ACL and routing back
        steps.append((f"nic:{d.node} egress reply", nic_d.first(("egress", ""), "established", da, sa, proto,
                                                                 port, eph)))
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        steps.append((f"leaf:{ld} acl {td} reply", leaf_d.first(("inbound", td), "any", da, sa, proto, port, eph)
                      if (d.node, td) in leaf_d.members else None))
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        ok, why = self._route(leaf_d, leaf_s, td, ts, sa, s)
        if not ok:
            return False, f"leaf:{ld} vrf {td} reply: {why}"
        steps.append((f"nic:{s.node} ingress reply", nic_s.first(("ingress", ""), "established", da, sa, proto,
                                                                 port, eph)))
        if not _allowed(steps[-1][1]):
            return False, _why(steps[-1])
        if not explain:
            return True, ""
        reasons = sorted({r for _, rule in steps if rule is not None for r in rule.reasons})
        return True, "allowed by " + ", ".join(reasons)

    def _walk_roce(self, s: Placement, d: Placement, sa: tuple[int, int], da: tuple[int, int], explain: bool
                   ) -> tuple[bool, str]:
        """RoCEv2 between s and d: both one-way trips (each to 4791 from an ephemeral port) must pass."""
        att = self.fabric.attachment
        steps: list[tuple[str, FlowRule | None]] = []
        for x, y, xa, ya, back in ((s, d, sa, da, ""), (d, s, da, sa, " reply")):
            tx, ty = x.workload.split("/", 1)[0], y.workload.split("/", 1)[0]
            lx, ly = att[x.node].leaf, att[y.node].leaf
            nic_x, nic_y = self.device(f"nic:{x.node}"), self.device(f"nic:{y.node}")
            leaf_x, leaf_y = self.device(f"leaf:{lx}"), self.device(f"leaf:{ly}")
            steps.append((f"nic:{x.node} egress{back}", nic_x.first(("egress", ""), STATELESS, xa, ya, "udp",
                                                                   EPHEMERAL_PORT, ROCE_V2_PORT)))
            if not _allowed(steps[-1][1]):
                return False, _why(steps[-1])
            steps.append((f"leaf:{lx} acl {tx}{back}", leaf_x.first(("inbound", tx), "any", xa, ya, "udp",
                                                                    EPHEMERAL_PORT, ROCE_V2_PORT)
                          if (x.node, tx) in leaf_x.members else None))
            if not _allowed(steps[-1][1]):
                return False, _why(steps[-1])
            ok, why = self._route(leaf_x, leaf_y, tx, ty, ya, y)
            if not ok:
                return False, f"leaf:{lx} vrf {tx}{back}: {why}"
            steps.append((f"nic:{y.node} ingress{back}", nic_y.first(("ingress", ""), STATELESS, xa, ya, "udp",
                                                                     EPHEMERAL_PORT, ROCE_V2_PORT)))
            if not _allowed(steps[-1][1]):
                return False, _why(steps[-1])
        if not explain:
            return True, ""
        reasons = sorted({r for _, rule in steps if rule is not None for r in rule.reasons})
        return True, f"allowed by {', '.join(reasons)} ({ROCE_NOTE})"

    def _route(self, here: _Device, there: _Device, tenant: str, dst_tenant: str, addr: tuple[int, int],
               dst: Placement) -> tuple[bool, str]:
        if tenant not in here.vrfs:
            return False, "VRF not on this leaf"
        into = here.route(tenant, addr)
        if into is None:
            return False, "no route"
        if into != dst_tenant:
            return False, f"route leads into {into}'s VRF, not {dst_tenant}'s"
        if (dst.node, dst_tenant) not in there.members:
            return False, f"{dst_tenant}'s VRF does not reach {dst.node} on the far leaf"
        return True, ""


def _allowed(rule: FlowRule | None) -> bool:
    return rule is not None and rule.action == "allow"


def _why(step: tuple[str, FlowRule | None]) -> str:
    where, rule = step
    if rule is None:
        return f"{where}: no rule matched"
    return f"{where}: {rule.action} ({', '.join(rule.reasons)})"


def port_classes(cuts: Iterable[int]) -> list[tuple[int, int]]:
    """The intervals of 1-65535 between the given cut points (each cut starts a new interval)."""
    points = sorted({c for c in cuts if 1 < c <= 65535} | {1})
    out = []
    for i, lo in enumerate(points):
        hi = points[i + 1] - 1 if i + 1 < len(points) else 65535
        out.append((lo, hi))
    return out


def _cuts(compiled: Compiled, flows: Iterable[Flow]) -> dict[str, list[int]]:
    cuts: dict[str, set[int]] = {"tcp": set(), "udp": {ROCE_V2_PORT, ROCE_V2_PORT + 1}}  # RoCEv2: a class alone
    for f in flows:
        cuts.setdefault(f.proto, set()).update((f.port, f.port + 1))
    for rs in compiled.devices.values():
        for r in rs.rules:
            for proto in (("tcp", "udp") if r.proto == "*" else (r.proto,)):
                for lo, hi in r.ports:
                    cuts.setdefault(proto, set()).update((lo, hi + 1))
    return {p: sorted(c) for p, c in cuts.items()}


def verify(compiled: Compiled, allowed: Any, exhaustive: bool = False) -> list[Mismatch]:
    """Every flow on which the devices and the policy disagree (empty: equivalent)."""
    fabric = compiled.fabric
    policy: set[tuple[str, str, str, int]] = set()
    flows = expand_allowed(allowed)
    for f in flows:
        policy.add((f"{f.src_tenant}/{f.src_group}", f"{f.dst_tenant}/{f.dst_group}", f.proto, f.port))
    classes = {p: port_classes(c) for p, c in _cuts(compiled, flows).items()}
    walker = Walker(compiled)
    revoked = _revoked(compiled)
    placed = [p for p in fabric.placements if p.workload in fabric.workload]
    by_key = {p.workload: p for p in placed}

    def expected(s: Placement, d: Placement, proto: str, lo: int) -> bool:
        if s.workload in revoked or d.workload in revoked or s.workload == d.workload:
            return False
        sg, dg = s.workload.rsplit("/", 1)[0], d.workload.rsplit("/", 1)[0]
        return (sg, dg, proto, lo) in policy or (is_rocev2(proto, lo) and (dg, sg, proto, lo) in policy)

    if exhaustive:
        todo: Iterable[tuple[Placement, Placement, str, tuple[int, int]]] = (
            (s, d, proto, cls) for s in placed for d in placed if s is not d
            for proto, cl in classes.items() for cls in cl)
    else:
        todo = _candidates(compiled, walker, by_key, classes, policy, placed)
    out = []
    for s, d, proto, (lo, _hi) in todo:
        want = expected(s, d, proto, lo)
        for fam in (4, 6):
            if (s.ipv4 if fam == 4 else s.ipv6) is None or (d.ipv4 if fam == 4 else d.ipv6) is None:
                continue
            got, detail = walker.walk(s, d, fam, proto, lo, explain=False)
            if got != want:
                detail = walker.walk(s, d, fam, proto, lo)[1]
                out.append(Mismatch(s.workload, d.workload, proto, lo, fam, want, got, detail))
    return sorted(out)


def _revoked(compiled: Compiled) -> frozenset[str]:
    ids = compiled.fabric.spiffe_ids()
    return frozenset(k for k, sid in ids.items() if sid in compiled.revoked) | frozenset(
        w.key for w in compiled.fabric.workloads if w.revoked)


def _candidates(compiled: Compiled, walker: Walker, by_key: Mapping[str, Placement],
                classes: Mapping[str, list[tuple[int, int]]], policy: set[tuple[str, str, str, int]],
                placed: list[Placement]) -> Iterable[tuple[Placement, Placement, str, tuple[int, int]]]:
    """Flows any NIC egress allow could admit (a stateless rule of either direction, its mirror too), and every
    flow the policy allows, RoCEv2 also the other way (each once)."""
    by_addr: dict[tuple[int, int], Placement] = {}
    for p in placed:
        for a in (p.ipv4, p.ipv6):
            if a is not None:
                by_addr[_addr(a)] = p  # type: ignore[index]
    by_group: dict[str, list[Placement]] = {}
    for p in placed:
        by_group.setdefault(p.workload.rsplit("/", 1)[0], []).append(p)
    seen: set[tuple[str, str, str, int]] = set()

    def members(cidrs: tuple[str, ...]) -> list[Placement]:
        out: list[Placement] = []
        for c in cidrs:
            n = ipaddress.ip_network(c)
            if n.num_addresses <= 256:
                out.extend(by_addr[(n.version, int(a))] for a in n if (n.version, int(a)) in by_addr)
            else:
                out.extend(p for k, p in by_addr.items() if k[0] == n.version and int(n.network_address) <= k[1]
                           <= int(n.broadcast_address))
        return out

    for rs in compiled.devices.values():
        if rs.kind != "nic":
            continue
        sets = rs.set_by_name
        for r in rs.rules:
            if r.action != "allow" or not (r.state == STATELESS or (r.direction == "egress" and r.state == "new")):
                continue
            srcs = placed if r.src == ANY else members(sets[r.src].v4 + sets[r.src].v6)
            dsts = placed if r.dst == ANY else members(sets[r.dst].v4 + sets[r.dst].v6)
            pairs = [(srcs, dsts), (dsts, srcs)] if r.state == STATELESS else [(srcs, dsts)]
            protos = ("tcp", "udp") if r.proto == "*" else (r.proto,)
            for proto in protos:
                cls = [c for c in classes[proto] if not r.ports or any(lo <= c[0] <= hi for lo, hi in r.ports)]
                for froms, tos in pairs:
                    for s in dict.fromkeys(froms):
                        for d in dict.fromkeys(tos):
                            for c in cls:
                                k = (s.workload, d.workload, proto, c[0])
                                if k not in seen and s is not d:
                                    seen.add(k)
                                    yield s, d, proto, c
    for sg, dg, proto, port in sorted(policy):
        klass = next(c for c in classes[proto] if c[0] <= port <= c[1])
        for a, b in ((sg, dg), (dg, sg)) if is_rocev2(proto, port) else ((sg, dg),):
            for s in by_group.get(a, ()):
                for d in by_group.get(b, ()):
                    k = (s.workload, d.workload, proto, klass[0])
                    if k not in seen and s is not d:
                        seen.add(k)
                        yield s, d, proto, klass
