"""How many hardware entries a rule costs on its device: what the per-device budget counts.

Shared by the compiler (budget check) and the renderers (which emit exactly this many entries per rule, or
fewer for a NIC where conjunctions share dimension flows), so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache, lru_cache

from enforcer.ir import ANY, STATELESS, AddressSet, FlowRule, Port

# Flows a NIC spends per host port and address, whatever the policy (see render/openflow.py):
# ARP out + in, IP classify out + in, RoCEv2 classify out + in, to-host forward = 7 per IPv4 address; IP
# classify out + in, RoCEv2 classify out + in, ND NS/NA out + in, to-host forward = 9 per IPv6 address; one
# to-network forward per port.
NIC_PER_V4 = 7
NIC_PER_V6 = 9
NIC_PER_PORT = 1
NIC_FIXED = 3  # table 0 drop; an invalid-state drop per direction (default denies and established are rules)


@cache
def port_masks(lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """The (value, mask) pairs whose union is exactly [lo, hi], as OpenFlow matches tp_dst=value/mask."""
    out: list[tuple[int, int]] = []
    while lo <= hi:
        size = 1
        while lo % (size * 2) == 0 and lo + size * 2 - 1 <= hi and size < 0x10000:
            size *= 2
        out.append((lo, 0xFFFF ^ (size - 1)))
        lo += size
    return tuple(out)


@lru_cache(maxsize=4096)  # port lists repeat: every rule of an entry has the entry's
def mask_count(ports: tuple[tuple[int, int], ...]) -> int:
    return sum(len(port_masks(lo, hi)) for lo, hi in ports) if ports else 1


Sizes = Mapping[str, tuple[int, int]]  # address set name -> (IPv4 CIDRs, IPv6 CIDRs)
ANY_SIZE = (1, 1)  # `*` counts as one address of each family


def set_sizes(sets: Iterable[AddressSet]) -> dict[str, tuple[int, int]]:
    return {s.name: (len(s.v4), len(s.v6)) for s in sets}


def family_members(s: AddressSet | None, family: int) -> tuple[str, ...] | None:
    """The set's CIDRs of one family; None for `*` (any)."""
    if s is None:
        return None
    return s.v4 if family == 4 else s.v6


def nic_rule_cost(rule: FlowRule, sizes: Sizes) -> int:
    """Flows for one NIC rule before conjunctions share dimension flows (an upper bound of the render)."""
    if rule.src == ANY and rule.dst == ANY:
        return 1
    s4, s6 = sizes[rule.src] if rule.src != ANY else ANY_SIZE
    d4, d6 = sizes[rule.dst] if rule.dst != ANY else ANY_SIZE
    return nic_cost(s4, s6, d4, d6, rule.ports, rule.state == STATELESS)


def nic_cost(s4: int, s6: int, d4: int, d6: int, ports: tuple[tuple[int, int], ...], mirrored: bool = False) -> int:
    """nic_rule_cost of a rule between sets (not both `*`) of these sizes per family: what the compiler sums.
    `mirrored`: a stateless (RoCEv2) rule, rendered once per direction (src -> dst and dst -> src)."""
    m = mask_count(ports)
    extra = m + 1 if ports else 1
    one = ((min(s4 * d4 * m, s4 + d4 + extra) if s4 and d4 else 0)
           + (min(s6 * d6 * m, s6 + d6 + extra) if s6 and d6 else 0))
    return 2 * one if mirrored else one


def leaf_rule_cost(rule: FlowRule, sizes: Sizes) -> int:
    """ACL entries for one leaf rule: NVUE takes one source, one destination and one port range per entry."""
    if rule.src == ANY and rule.dst == ANY:
        return 1 + V6_ACL_WEIGHT  # one entry in the ipv4 ACL and one in the ipv6 ACL
    s4, s6 = sizes[rule.src] if rule.src != ANY else ANY_SIZE
    d4, d6 = sizes[rule.dst] if rule.dst != ANY else ANY_SIZE
    return leaf_cost(s4, s6, d4, d6, rule.ports)


# An IPv6 ACL entry takes twice an IPv4 entry's room in a Spectrum-2 and later switch's ATCAM: NVIDIA documents
# 25,000 IPv4 or 12,500 IPv6 entries (12,500 / 6,250 in atomic update mode). Budgets count IPv4 entries.
# docs.nvidia.com/networking-ethernet-software/cumulus-linux-512/System-Configuration/Access-Control-Lists/
# Access-Control-List-Configuration/ ("ATCAM on Spectrum-2 and Later")
V6_ACL_WEIGHT = 2


def leaf_cost(s4: int, s6: int, d4: int, d6: int, ports: tuple[tuple[int, int], ...]) -> int:
    """leaf_rule_cost of a rule between sets (not both `*`) of these sizes per family, in IPv4 entries."""
    return (s4 * d4 + V6_ACL_WEIGHT * s6 * d6) * (len(ports) or 1)


def nic_fixed_cost(ports: tuple[Port, ...]) -> int:
    return NIC_FIXED + sum(NIC_PER_PORT + NIC_PER_V4 * len(p.v4) + NIC_PER_V6 * len(p.v6) for p in ports)
