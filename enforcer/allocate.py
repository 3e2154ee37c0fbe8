"""L3VNI, VLAN and prefix allocation for tenants that lack them, from configured pools.

Deterministic (tenants in slug order take the lowest free value), so two imports of one file agree.
Never two tenants on one VNI or VLAN, never overlapping prefixes: a file that asks for either is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from enforcer.errors import FabricError
from enforcer.fabric import IPNet, Tenant


@dataclass(frozen=True)
class Pools:
    vni: tuple[int, int] = (10_000, 16_777_215)
    vlan: tuple[int, int] = (100, 4094)
    ipv4: str = "10.0.0.0/8"
    ipv4_len: int = 20
    ipv6: str | None = None  # e.g. "fd00::/32" with ipv6_len 48; None: no IPv6 prefix is allocated
    ipv6_len: int = 48


def allocate(partial: Mapping[str, Mapping[str, Any]], pools: Pools) -> tuple[Tenant, ...]:
    """Tenants from {slug: {vni?, vlan?, prefixes?: [IPNet], quarantined, revoked}}; FabricError on a clash."""
    owner_vni: dict[int, str] = {}
    owner_vlan: dict[int, str] = {}
    taken: list[tuple[IPNet, str]] = []
    for slug in sorted(partial):
        e = partial[slug]
        if "vni" in e:
            if e["vni"] in owner_vni:
                raise FabricError(f"tenants {owner_vni[e['vni']]} and {slug} both use VNI {e['vni']}")
            owner_vni[e["vni"]] = slug
        if "vlan" in e:
            if e["vlan"] in owner_vlan:
                raise FabricError(f"tenants {owner_vlan[e['vlan']]} and {slug} both use VLAN {e['vlan']}")
            owner_vlan[e["vlan"]] = slug
        for net in e.get("prefixes", ()):
            for other, who in taken:
                if net.version == other.version and net.overlaps(other):
                    raise FabricError(f"tenant {slug}'s prefix {net} overlaps {who}'s {other}")
            taken.append((net, slug))
    vnis = _Lowest("VNI", pools.vni, owner_vni)
    vlans = _Lowest("VLAN", pools.vlan, owner_vlan)
    v4 = _Carver(ipaddress.ip_network(pools.ipv4), pools.ipv4_len, taken)
    v6 = _Carver(ipaddress.ip_network(pools.ipv6), pools.ipv6_len, taken) if pools.ipv6 else None
    out = []
    for slug in sorted(partial):
        e = partial[slug]
        vni = e["vni"] if "vni" in e else vnis.take(slug)
        vlan = e["vlan"] if "vlan" in e else vlans.take(slug)
        nets = list(e.get("prefixes") or ())
        if not nets:
            nets.append(v4.take(slug))
            if v6 is not None:
                nets.append(v6.take(slug))
        prefixes = tuple(str(n) for n in sorted(nets, key=lambda n: (n.version, n)))
        out.append(Tenant(slug, int(vni), int(vlan), prefixes, bool(e.get("quarantined")), bool(e.get("revoked"))))
    return tuple(out)


class _Lowest:
    """The lowest free integer of a pool, walking up (values only ever get taken)."""

    def __init__(self, what: str, pool: tuple[int, int], owners: dict[int, str]) -> None:
        self.what, self.pool, self.owners, self.next = what, pool, owners, pool[0]

    def take(self, slug: str) -> int:
        while self.next in self.owners:
            self.next += 1
        if self.next > self.pool[1]:
            raise FabricError(f"the {self.what} pool {self.pool} is exhausted (tenant {slug})")
        self.owners[self.next] = slug
        return self.next


class _Carver:
    def __init__(self, pool: IPNet, length: int, taken: list[tuple[IPNet, str]]) -> None:
        self._subnets = pool.subnets(new_prefix=length)
        self._taken = taken
        self._pool = pool

    def take(self, slug: str) -> IPNet:
        for net in self._subnets:
            if not any(net.version == t.version and net.overlaps(t) for t, _ in self._taken):
                self._taken.append((net, slug))
                return net
        raise FabricError(f"the prefix pool {self._pool} is exhausted (tenant {slug})")
