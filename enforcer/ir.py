"""The intermediate representation: one rule set per device, independent of the device's syntax.

Devices are `nic:<node>` (a BlueField-3 SuperNIC: stateful, conntrack zone per tenant) and `leaf:<name>` (a
Cumulus leaf: tenant VRFs with their L3VNI, stateless ACLs bound inbound on the tenant attachments).

Rules name address sets, never addresses: a set is a group's addresses (`acme/train`), the union of a flow's
source groups (`src:<dst>:<proto>:<reason>`), the part of one that sits on this device (`<set>@<node>`), or the
prefixes of the source tenants (`tenants:...`, for a leaf's stateless return rules). `*` is any address.

Evaluation order on every device: rules by descending priority, first match wins; the compiler always ends
each direction (NIC) or each ACL (leaf) with a `deny` at priority 0, so nothing is allowed by omission.
A NIC rule's `state` is `new` (first packet of a connection: it is committed to conntrack when allowed),
`established` (a packet of a committed connection, in either direction) or `stateless`: RoCEv2, UDP to port
4791, which never goes through conntrack (a BlueField-3's hardware conntrack does not take it, so it would stay
on the Arm cores). Every RoCEv2 packet, requests and responses alike, goes to UDP port 4791 from a varying source
port, so a `stateless` rule admits its packets (src -> dst, to 4791) and their mirror (dst -> src, to 4791) on
this NIC: a RoCEv2 allowance is symmetric. Only `stateless` rules and denies see a NIC's UDP/4791 packets; the
other rules never do (see `roce_split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from core.canonical import canonical_json, sha256_hex
from core.rocev2 import ROCE_V2_PORT

ANY = "*"
STATELESS = "stateless"
ROCE_PORTS: tuple[tuple[int, int], ...] = ((ROCE_V2_PORT, ROCE_V2_PORT),)
PRIO_ESTABLISHED = 200
PRIO_ALLOW = 100
PRIO_DENY = 0


class AddressSet(NamedTuple):
    name: str
    v4: tuple[str, ...]  # collapsed CIDRs
    v6: tuple[str, ...]


class FlowRule(NamedTuple):
    priority: int
    direction: str  # nic: "egress" (from a local workload) | "ingress" (to one); leaf: "inbound"
    scope: str  # leaf: the tenant whose ACL holds the rule; nic: ""
    src: str  # address-set name or "*"
    dst: str
    proto: str  # "tcp" | "udp" | "*"
    ports: tuple[tuple[int, int], ...]  # inclusive ranges; () = any port
    port_side: str = "dst"  # "src" on a leaf's stateless return rule (the service answering)
    state: str = "new"  # nic: "new" | "established" | "stateless" (RoCEv2); leaf rules are stateless: "any"
    action: str = "allow"  # "allow" | "deny"
    reasons: tuple[str, ...] = ()  # policy rule ("intra-tenant", "platform-service") or "grant:<id>"


class Leak(NamedTuple):
    """A route imported into a VRF from another tenant's VRF, because a grant or a platform service needs it."""

    prefix: str
    from_vrf: str
    reasons: tuple[str, ...]


class Vrf(NamedTuple):
    name: str
    tenant: str
    vni: int
    members: tuple[str, ...]  # leaf ports (subinterfaces) in the VRF
    prefixes: tuple[str, ...]  # the tenant's own prefixes
    leaks: tuple[Leak, ...] = ()


class Port(NamedTuple):
    """A NIC host port with its workload, or a leaf attachment (subinterface) of a (node, tenant)."""

    name: str
    tenant: str
    vlan: int  # leaf: the subinterface VLAN; nic: the tenant's VLAN tag on the uplink and its ct zone
    node: str
    workload: str = ""  # nic only
    v4: tuple[str, ...] = ()
    v6: tuple[str, ...] = ()
    base: str = ""  # leaf: the physical port under the subinterface


@dataclass(frozen=True)
class DeviceRuleSet:
    device: str  # "nic:<node>" | "leaf:<name>"
    kind: str  # "nic" | "leaf"
    uplink: str = ""  # nic: the uplink port towards the leaf
    ports: tuple[Port, ...] = ()
    sets: tuple[AddressSet, ...] = ()
    rules: tuple[FlowRule, ...] = ()  # in evaluation order
    vrfs: tuple[Vrf, ...] = ()
    cost: int = 0  # nic: OpenFlow flows; leaf: ACL entries (what the budget counts)

    @property
    def name(self) -> str:
        return self.device.split(":", 1)[1]

    @cached_property
    def set_by_name(self) -> dict[str, AddressSet]:
        return {s.name: s for s in self.sets}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (lists for tuples), the form that is hashed and stored."""
        return {
            "device": self.device, "kind": self.kind, "uplink": self.uplink,
            "ports": [{**p._asdict(), "v4": list(p.v4), "v6": list(p.v6)} for p in self.ports],
            "sets": [{"name": s.name, "v4": list(s.v4), "v6": list(s.v6)} for s in self.sets],
            "rules": [{**r._asdict(), "ports": [list(x) for x in r.ports], "reasons": list(r.reasons)}
                      for r in self.rules],
            "vrfs": [{**v._asdict(), "members": list(v.members), "prefixes": list(v.prefixes),
                      "leaks": [{**lk._asdict(), "reasons": list(lk.reasons)} for lk in v.leaks]} for v in self.vrfs],
            "cost": self.cost,
        }

    @cached_property
    def canonical(self) -> bytes:
        """RFC 8785 bytes of to_dict(): written straight from the tuples (enforcer.hashing) when every value is
        of the types the IR holds, else through core.canonical."""
        from enforcer.hashing import canonical_bytes  # it reads this module's types

        fast = canonical_bytes(self)
        return fast if fast is not None else canonical_json(self.to_dict())

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 of the canonical bytes (kept: the reconciler compares every device's hash on every run)."""
        return sha256_hex(self.canonical)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> DeviceRuleSet:
        return DeviceRuleSet(
            device=d["device"], kind=d["kind"], uplink=d["uplink"],
            ports=tuple(Port(**{**p, "v4": tuple(p["v4"]), "v6": tuple(p["v6"])}) for p in d["ports"]),
            sets=tuple(AddressSet(s["name"], tuple(s["v4"]), tuple(s["v6"])) for s in d["sets"]),
            rules=tuple(FlowRule(**{**r, "ports": tuple(tuple(x) for x in r["ports"]),
                                    "reasons": tuple(r["reasons"])}) for r in d["rules"]),
            vrfs=tuple(Vrf(v["name"], v["tenant"], v["vni"], tuple(v["members"]), tuple(v["prefixes"]),
                           tuple(Leak(x["prefix"], x["from_vrf"], tuple(x["reasons"])) for x in v["leaks"]))
                       for v in d["vrfs"]),
            cost=d["cost"])


def rule_order(rule: FlowRule) -> tuple[Any, ...]:
    """Evaluation order: priority descending, then a canonical order so equal inputs give equal lists: the
    fields in FlowRule's own order, so rules of one priority sort as plain tuples (enforcer.aggregate)."""
    return (-rule.priority, rule.direction, rule.scope, rule.src, rule.dst, rule.proto, rule.ports,
            rule.port_side, rule.state, rule.action, rule.reasons)


def merge_ranges(ports: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Sorted, non-overlapping, non-adjacent inclusive ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ports):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def ports_to_ranges(ports: list[int] | tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return merge_ranges([(p, p) for p in ports])


def range_covers(outer: tuple[tuple[int, int], ...], inner: tuple[tuple[int, int], ...]) -> bool:
    """Every port of `inner` lies in `outer` (both merged)."""
    return all(any(a <= lo and hi <= b for a, b in outer) for lo, hi in inner)


@lru_cache(maxsize=4096)  # port lists repeat: every rule of an entry has the entry's
def roce_split(proto: str, ports: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...] | None, bool]:
    """What of an allowed (proto, ports) goes through conntrack on a NIC, and whether RoCEv2 (UDP to 4791) is
    allowed too: (ports left to the stateful rules, None when no port is; RoCEv2 among them). UDP port 4791 is
    carved out of the ports (a range around it splits in two), except from "any port" (`()`), which stays whole
    rather than become ~30 masked matches: its 4791 part never reaches a stateful rule anyway."""
    if proto != "udp":
        return ports, False
    if not ports:
        return ports, True
    if not any(lo <= ROCE_V2_PORT <= hi for lo, hi in ports):
        return ports, False
    rest: list[tuple[int, int]] = []
    for lo, hi in ports:
        if lo <= ROCE_V2_PORT <= hi:
            if lo < ROCE_V2_PORT:
                rest.append((lo, ROCE_V2_PORT - 1))
            if hi > ROCE_V2_PORT:
                rest.append((ROCE_V2_PORT + 1, hi))
        else:
            rest.append((lo, hi))
    return (tuple(rest) or None), True
