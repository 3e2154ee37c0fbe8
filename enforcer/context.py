"""The fabric indexed for one compile: who is a member of what (revoked workloads left out) and their addresses.

Split in two because a recompile whose revoked set changed needs new memberships but not new addresses: the
fabric-only part (`FabricIndex`, addresses as integers, tenant prefixes) is built once per Fabric and shared.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from enforcer.fabric import Fabric, Placement
from enforcer.ir import AddressSet

V46 = tuple[tuple[str, ...], tuple[str, ...]]  # collapsed CIDRs per family
_new = tuple.__new__  # a NamedTuple built without its Python-level __new__


class FabricIndex:
    """What the compile reads of the fabric alone (never mutated after build, except its memo caches)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.leaf_of = {n: a.leaf for n, a in fabric.attachment.items()}
        self.vrf_of = {t.slug: t.vrf for t in fabric.tenants}
        self.tenant_of = {p.workload: p.workload.split("/", 1)[0] for p in fabric.placements}
        self.nic_dev = {n: f"nic:{n}" for n in [*(x.name for x in fabric.nodes), *(p.node for p in fabric.placements)]}
        self.leaf_dev = {x: f"leaf:{x}" for x in [*(s.name for s in fabric.leaves), *self.leaf_of.values()]}
        # addresses as integers, and the text of each, so collapsing never parses a string twice
        self.ints: dict[str, tuple[int | None, int | None]] = {}
        self.text: dict[tuple[int, int], str] = {}
        self.single: dict[str, V46] = {}  # workload -> its own addresses as /32, /128
        for p in fabric.placements:
            a4 = int(ipaddress.IPv4Address(p.ipv4)) if p.ipv4 else None
            a6 = int(ipaddress.IPv6Address(p.ipv6)) if p.ipv6 else None
            self.ints[p.workload] = (a4, a6)
            t6 = str(ipaddress.IPv6Address(a6)) if a6 is not None else None
            if a4 is not None:
                self.text[(4, a4)] = str(p.ipv4)
            if a6 is not None and t6 is not None:
                self.text[(6, a6)] = t6
            self.single[p.workload] = ((f"{p.ipv4}/32",) if p.ipv4 else (), (f"{t6}/128",) if t6 else ())
        self._prefixes: dict[tuple[str, ...], V46] = {}
        self.one_reason: dict[str, tuple[str]] = {}  # reason -> (reason,): one tuple for every rule and leak

    def tenant_prefixes(self, tenants: Sequence[str]) -> V46:
        key = tuple(tenants)
        hit = self._prefixes.get(key)
        if hit is None:
            nets = [n for t in key for n in self.fabric.tenant[t].networks()]
            v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
            v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
            hit = self._prefixes[key] = (tuple(str(n) for n in ipaddress.collapse_addresses(v4)),
                                         tuple(str(n) for n in ipaddress.collapse_addresses(v6)))
        return hit


class Context:
    """Membership and addresses under one fabric and one revoked set."""

    def __init__(self, fabric: Fabric, revoked: frozenset[str], index: FabricIndex | None = None) -> None:
        self.fabric = fabric
        self.index = index if index is not None and index.fabric is fabric else FabricIndex(fabric)
        self.ints, self.text, self.leaf_of = self.index.ints, self.index.text, self.index.leaf_of
        flagged = frozenset(w.key for w in fabric.workloads if w.revoked)
        if revoked:  # SPIFFE IDs only when some are named: formatting every workload's costs
            ids = fabric.spiffe_ids()
            self.revoked_ids = revoked | frozenset(ids[k] for k in flagged)
            self.revoked_workloads = frozenset(k for k, sid in ids.items() if sid in self.revoked_ids) | flagged
        else:
            self.revoked_ids = frozenset(w.spiffe_id(fabric.trust_domain) for w in fabric.workloads if w.revoked)
            self.revoked_workloads = flagged
        gone, known = self.revoked_workloads, fabric.workload
        self.members: dict[str, tuple[Placement, ...]] = {
            g: ps if not gone and all(p.workload in known for p in ps)
            else tuple(p for p in ps if p.workload not in gone and p.workload in known)
            for g, ps in fabric.members.items()}
        # (device kind, set name) -> the set: within one context a name always means the same addresses
        self.sets: dict[tuple[str, str], AddressSet] = {}

    def addresses(self, placements: Sequence[Placement]) -> V46:
        """The placements' addresses as collapsed CIDRs per family (what ipaddress.collapse_addresses gives)."""
        if len(placements) == 1:
            return self.index.single[placements[0].workload]
        v4: list[int] = []
        v6: list[int] = []
        for p in placements:
            a4, a6 = self.ints[p.workload]
            if a4 is not None:
                v4.append(a4)
            if a6 is not None:
                v6.append(a6)
        return self._collapse(v4, 4), self._collapse(v6, 6)

    def address_set(self, kind: str, name: str, placements: Sequence[Placement]) -> AddressSet:
        """The named set of the placements' addresses, built once per (device kind, name)."""
        hit = self.sets.get((kind, name))
        if hit is None:
            hit = self.sets[(kind, name)] = _new(AddressSet, (name, *self.addresses(placements)))
        return hit

    def address_set_once(self, kind: str, name: str, placements: Sequence[Placement]) -> AddressSet:
        """address_set for a name no other entry uses: not kept."""
        return _new(AddressSet, (name, *self.addresses(placements)))

    def prefix_set(self, kind: str, name: str, tenants: Sequence[str]) -> AddressSet:
        """The named set of the tenants' prefixes, built once per (device kind, name)."""
        hit = self.sets.get((kind, name))
        if hit is None:
            hit = self.sets[(kind, name)] = AddressSet(name, *self.index.tenant_prefixes(tenants))
        return hit

    def tenant_prefixes(self, tenants: Sequence[str]) -> V46:
        return self.index.tenant_prefixes(tenants)

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
