"""The fabric as the database holds it (inventory's tables), in the two forms the enforcer uses.

- `stored_document`: the whole stored fabric as a document of the fabric file's shape. Every fabric
  change (an import, one node, one placement) is merged onto it and the result is checked as a whole by
  `enforcer.fabric_file` (workflows/fabric.py), so the file and the API obey one set of rules.
- `compile_fabric_of`: the `Fabric` the reconciler compiles: topology, addressing and membership only.
  Tenants without a placement, unplaced workloads, quarantine and revocation flags are left out on purpose:
  they do not change a compile (quarantine and revocation act through the policy's allowed flows and the
  revoked identities), so creating a tenant or revoking a workload leaves this Fabric equal and the
  reconciler recompiles incrementally instead of from scratch.

Reads only (plain Core selects, no ORM objects: the fabric can hold tens of thousands of rows).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlmodel import Session

from enforcer.fabric import Fabric, Link, Node, Placement, Switch, Tenant, Workload
from inventory.models import FabricLink, FabricNode, FabricSwitch, WorkloadGroup
from inventory.models import Placement as PlacementRow
from inventory.models import Tenant as TenantRow
from inventory.models import Workload as WorkloadRow

_tenants = TenantRow.__table__  # type: ignore[attr-defined]
_groups = WorkloadGroup.__table__  # type: ignore[attr-defined]
_workloads = WorkloadRow.__table__  # type: ignore[attr-defined]
_nodes = FabricNode.__table__  # type: ignore[attr-defined]
_switches = FabricSwitch.__table__  # type: ignore[attr-defined]
_links = FabricLink.__table__  # type: ignore[attr-defined]
_placements = PlacementRow.__table__  # type: ignore[attr-defined]


def tenant_prefixes(prefix: str | None, prefix6: str | None) -> list[str]:
    return [p for p in (prefix, prefix6) if p]


def _exposed(ports: Any) -> list[str]:
    return sorted(f"{p['proto']}/{p['port']}" for p in ports or [] if isinstance(p, dict))


def stored_tenants(session: Session) -> dict[str, Any]:
    """The `tenants` section of the stored fabric: every tenant's VNI, VLAN, prefixes (those it has)."""
    tenants: dict[str, Any] = {}
    for t in session.connection().execute(select(_tenants).order_by(_tenants.c.slug)):
        body: dict[str, Any] = {"quarantined": bool(t.quarantined)}
        if t.l3vni is not None:
            body["vni"] = t.l3vni
        if t.vlan is not None:
            body["vlan"] = t.vlan
        if t.prefix or t.prefix6:
            body["prefixes"] = tenant_prefixes(t.prefix, t.prefix6)
        tenants[t.slug] = body
    return tenants


def stored_document(session: Session, trust_domain: str) -> dict[str, Any]:
    """Everything stored, as a fabric document (sections in the file's shape, keys sorted)."""
    conn = session.connection()
    tenants = stored_tenants(session)
    groups = {f"{g.tenant}/{g.name}": {"ports": _exposed(g.ports), "quarantined": bool(g.quarantined)}
              for g in conn.execute(select(_groups).order_by(_groups.c.tenant, _groups.c.name))}
    workloads = {f"{w.tenant}/{w.group}/{w.name}": {"revoked": bool(w.revoked)}
                 for w in conn.execute(select(_workloads).order_by(_workloads.c.tenant, _workloads.c.group,
                                                                   _workloads.c.name))}
    nodes = {n.name: {"nic": {"uplinks": list(n.uplinks), "host_ports": list(n.host_ports)}}
             for n in conn.execute(select(_nodes).order_by(_nodes.c.name))}
    leaves: dict[str, Any] = {}
    spines: dict[str, Any] = {}
    for s in conn.execute(select(_switches).order_by(_switches.c.name)):
        (leaves if s.role == "leaf" else spines)[s.name] = {"ports": list(s.ports), "model": s.model}
    links = [[f"{x.leaf}:{x.leaf_port}", f"{x.peer}:{x.peer_port}"]
             for x in conn.execute(select(_links).order_by(_links.c.leaf, _links.c.leaf_port))]
    placements: dict[str, Any] = {}
    for p in conn.execute(select(_placements).order_by(_placements.c.workload)):
        body = {"node": p.node, "port": p.port}
        if p.ipv4:
            body["ipv4"] = p.ipv4
        if p.ipv6:
            body["ipv6"] = p.ipv6
        if p.selectors:
            body["selectors"] = list(p.selectors)
        placements[p.workload] = body
    return {"trust_domain": trust_domain, "tenants": tenants, "groups": groups, "workloads": workloads,
            "nodes": nodes, "leaves": leaves, "spines": spines, "links": links, "placements": placements}


def compile_fabric_of(session: Session, trust_domain: str) -> Fabric:
    """The Fabric to compile: what is stored, already checked when it was written (see the docstring)."""
    conn = session.connection()
    placements = tuple(
        Placement(p.workload, p.node, p.port, p.ipv4, p.ipv6, tuple(p.selectors or ()))
        for p in conn.execute(select(_placements).order_by(_placements.c.workload)))
    placed_tenants = {p.workload.split("/", 1)[0] for p in placements}
    tenants = tuple(
        Tenant(t.slug, t.l3vni, t.vlan, tuple(tenant_prefixes(t.prefix, t.prefix6)))
        for t in conn.execute(select(_tenants).order_by(_tenants.c.slug))
        if t.slug in placed_tenants and t.l3vni is not None and t.vlan is not None)
    workloads = tuple(Workload(t, g, n) for p in placements for t, g, n in (p.workload.split("/"),))
    nodes = tuple(Node(n.name, tuple(n.uplinks), tuple(n.host_ports))
                  for n in conn.execute(select(_nodes).order_by(_nodes.c.name)))
    switches = tuple(Switch(s.name, "leaf" if s.role == "leaf" else "spine", tuple(s.ports), s.model)
                     for s in conn.execute(select(_switches).order_by(_switches.c.name)))
    links = tuple(sorted(Link(x.leaf, x.leaf_port, x.peer, x.peer_port, "node" if x.peer_kind == "node" else "spine")
                         for x in conn.execute(select(_links))))
    return Fabric(trust_domain, tenants, (), workloads, nodes, switches, links, placements)
