"""The compiler's input: the physical fabric, the tenants on it and where each workload runs.

Frozen dataclasses only, so a Fabric can be hashed into a cache key and shared between threads. The YAML
file format and its strict parser live in `enforcer.fabric_file`; the database layer (a later issue) builds
the same objects from its tables. Names follow the hardware: a GPU node has one BlueField-3 SuperNIC whose
uplink ports face leaf switch ports and whose host-facing ports (VF representors) each carry one workload;
leaves (Spectrum-4 SN5600, Cumulus) face spines.

A tenant is attached to a leaf once per node that hosts one of its workloads: on a Cumulus leaf that
attachment is the routed subinterface `<leaf port>.<tenant vlan>` in the tenant's VRF; the lab, which has
no VLAN devices, realises it as one port per (node, tenant). The tenant's VLAN id doubles as its conntrack
zone on every SuperNIC (unique per tenant, 16 bits, stable while other tenants come and go).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

from pki.spiffe_id import workload_id

Proto = Literal["tcp", "udp"]
PROTOS: tuple[Proto, ...] = ("tcp", "udp")
PLATFORM_TENANT = "platform"
IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Tenant:
    slug: str
    vni: int  # the L3VNI of its VRF (EVPN type-5)
    vlan: int  # attachment VLAN on leaf ports; also its conntrack zone on every SuperNIC
    prefixes: tuple[str, ...]  # normalised CIDRs, IPv4 and/or IPv6
    quarantined: bool = False
    revoked: bool = False  # every identity of the tenant revoked through pki

    @property
    def vrf(self) -> str:
        """The VRF name on every leaf: derived from the VNI because Linux names hold 15 characters."""
        return f"vrf{self.vni}"

    def networks(self) -> tuple[IPNet, ...]:
        return tuple(ipaddress.ip_network(p) for p in self.prefixes)


@dataclass(frozen=True)
class Group:
    tenant: str
    name: str
    exposed: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ((proto, sorted ports), ...) sorted by proto
    quarantined: bool = False
    revoked: bool = False

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"


@dataclass(frozen=True)
class Workload:
    tenant: str
    group: str
    name: str
    revoked: bool = False

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.group}/{self.name}"

    @property
    def group_key(self) -> str:
        return f"{self.tenant}/{self.group}"

    def spiffe_id(self, trust_domain: str) -> str:
        return str(workload_id(trust_domain, self.tenant, self.group, self.name))


@dataclass(frozen=True)
class Node:
    """A GPU node and its BlueField-3 SuperNIC."""

    name: str
    uplinks: tuple[str, ...]  # NIC ports that face leaf ports
    host_ports: tuple[str, ...]  # host-facing ports / VF representors, one workload each


@dataclass(frozen=True)
class Switch:
    name: str
    role: Literal["leaf", "spine"]
    ports: tuple[str, ...]
    model: str = "sn5600"


@dataclass(frozen=True, order=True)
class Link:
    """A cable: (leaf, leaf port) to a node's NIC uplink, or (leaf, leaf port) to (spine, spine port)."""

    leaf: str
    leaf_port: str
    peer: str  # node or spine name
    peer_port: str
    peer_kind: Literal["node", "spine"]


@dataclass(frozen=True)
class Placement:
    workload: str  # tenant/group/name
    node: str
    port: str  # the NIC host-facing port (VF representor)
    ipv4: str | None = None
    ipv6: str | None = None
    selectors: tuple[str, ...] = ()  # workload attestation on its node (pki.selectors); not compiled

    def addresses(self) -> tuple[str, ...]:
        return tuple(a for a in (self.ipv4, self.ipv6) if a is not None)


@dataclass(frozen=True)
class Grant:
    id: str
    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    ports: tuple[int, ...]
    expires_at: datetime


@dataclass(frozen=True)
class Attachment:
    """Where a node meets its leaf: the NIC uplink and the leaf port on either end of the cable."""

    node: str
    uplink: str
    leaf: str
    leaf_port: str


@dataclass(frozen=True)
class Fabric:
    trust_domain: str
    tenants: tuple[Tenant, ...] = ()
    groups: tuple[Group, ...] = ()
    workloads: tuple[Workload, ...] = ()
    nodes: tuple[Node, ...] = ()
    switches: tuple[Switch, ...] = ()
    links: tuple[Link, ...] = ()
    placements: tuple[Placement, ...] = ()
    grants: tuple[Grant, ...] = ()

    # ------------------------------------------------------------ indexes (built once per Fabric)
    @cached_property
    def tenant(self) -> dict[str, Tenant]:
        return {t.slug: t for t in self.tenants}

    @cached_property
    def group(self) -> dict[str, Group]:
        return {g.key: g for g in self.groups}

    @cached_property
    def workload(self) -> dict[str, Workload]:
        return {w.key: w for w in self.workloads}

    @cached_property
    def node(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def leaves(self) -> tuple[Switch, ...]:
        return tuple(s for s in self.switches if s.role == "leaf")

    @cached_property
    def spines(self) -> tuple[Switch, ...]:
        return tuple(s for s in self.switches if s.role == "spine")

    @cached_property
    def placement(self) -> dict[str, Placement]:
        return {p.workload: p for p in self.placements}

    @cached_property
    def attachment(self) -> dict[str, Attachment]:
        """node -> its attachment: the first of its uplinks (sorted) that is cabled to a leaf.

        A second uplink (a dual-homed node) is modelled but not used for tenant traffic yet."""
        out: dict[str, Attachment] = {}
        for link in sorted(self.links, key=lambda x: (x.peer, x.peer_port)):
            if link.peer_kind == "node" and link.peer not in out:
                out[link.peer] = Attachment(link.peer, link.peer_port, link.leaf, link.leaf_port)
        return out

    @cached_property
    def members(self) -> dict[str, tuple[Placement, ...]]:
        """group key -> placements of its workloads (revoked workloads included; the compiler drops them)."""
        out: dict[str, list[Placement]] = {}
        for p in self.placements:
            t, g, _ = p.workload.split("/")
            out.setdefault(f"{t}/{g}", []).append(p)
        return {k: tuple(sorted(v, key=lambda p: p.workload)) for k, v in out.items()}

    @cached_property
    def placements_on(self) -> dict[str, tuple[Placement, ...]]:
        """node -> the placements on it, by workload."""
        out: dict[str, list[Placement]] = {}
        for p in self.placements:
            out.setdefault(p.node, []).append(p)
        return {k: tuple(sorted(v, key=lambda p: p.workload)) for k, v in out.items()}

    @cached_property
    def nodes_under(self) -> dict[str, tuple[str, ...]]:
        """leaf -> the nodes whose attachment is on it."""
        out: dict[str, list[str]] = {}
        for a in self.attachment.values():
            out.setdefault(a.leaf, []).append(a.node)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def spiffe_ids(self) -> dict[str, str]:
        """workload key -> SPIFFE ID."""
        return {w.key: w.spiffe_id(self.trust_domain) for w in self.workloads}


def sorted_unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(values)))


def to_ns(when: datetime) -> int:
    """Nanoseconds since the epoch, as policy data carries grant expiry."""
    return int((when - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1_000_000) * 1000


def policy_data(fabric: Fabric) -> dict[str, Any]:
    """The `data` document rego/flows.rego reads, built from a self-contained fabric (lab files, tests,
    bench): the same shape policy/data.py builds from the database."""
    tenants: dict[str, Any] = {}
    for t in sorted(fabric.tenants, key=lambda t: t.slug):
        entry: dict[str, Any] = {"quarantined": t.quarantined, "groups": {}}
        if t.revoked:
            entry["revoked"] = True
        tenants[t.slug] = entry
    for g in sorted(fabric.groups, key=lambda g: g.key):
        ge: dict[str, Any] = {"labels": {}, "exposed": {p: list(ports) for p, ports in g.exposed},
                              "sensitivity": "normal", "quarantined": g.quarantined}
        if g.revoked:
            ge["revoked"] = True
        tenants[g.tenant]["groups"][g.name] = ge
    grants: dict[str, Any] = {}
    for gr in sorted(fabric.grants, key=lambda g: g.id):
        grants.setdefault(gr.src_tenant, {}).setdefault(gr.dst_tenant, {})[gr.id] = {
            "src_group": gr.src_group, "dst_group": gr.dst_group, "proto": gr.proto,
            "ports": sorted(gr.ports), "expires_at_ns": to_ns(gr.expires_at)}
    revoked = {w.spiffe_id(fabric.trust_domain): True for w in fabric.workloads if w.revoked}
    return {"tf": {"tenants": tenants, "grants": grants, "revoked": dict(sorted(revoked.items()))}}


def revoked_ids(fabric: Fabric) -> frozenset[str]:
    """SPIFFE IDs of the fabric's revoked workloads."""
    return frozenset(w.spiffe_id(fabric.trust_domain) for w in fabric.workloads if w.revoked)
