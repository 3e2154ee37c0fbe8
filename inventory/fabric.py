"""The fabric's rows: read them, and write a checked desired state as the smallest set of row changes with
one audit event in the caller's transaction.

The rules a fabric obeys (ports exist, a port carries one cable, addresses inside the tenant's prefixes and
unique, ...) are checked on the whole merged fabric by `enforcer.fabric_file` before anything reaches
`write` (workflows/fabric.py composes the two); the unique constraints of the tables hold the last line
(one workload per host port, one owner per address, one cable per port) under concurrency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, text
from sqlmodel import Session

from audit import Actor, record
from inventory.models import FabricLink, FabricNode, FabricSwitch, Placement

_nodes = FabricNode.__table__  # type: ignore[attr-defined]
_switches = FabricSwitch.__table__  # type: ignore[attr-defined]
_links = FabricLink.__table__  # type: ignore[attr-defined]
_placements = Placement.__table__  # type: ignore[attr-defined]

NodeRow = tuple[tuple[str, ...], tuple[str, ...]]  # uplinks, host ports
SwitchRow = tuple[str, tuple[str, ...], str]  # role, ports, model
LinkRow = tuple[str, str, str, str, str]  # leaf, leaf port, peer, peer port, peer kind
PlacementRow = tuple[str, str, str | None, str | None, tuple[str, ...]]  # node, port, ipv4, ipv6, selectors
MAX_NAMES = 10  # names per list in an audit summary (an import of a thousand nodes gives the count)
_LOCK_KEY = 0x7466_6162  # PostgreSQL advisory lock: one fabric (or tenant allocation) writer at a time


@dataclass
class FabricRows:
    nodes: dict[str, NodeRow] = field(default_factory=dict)
    switches: dict[str, SwitchRow] = field(default_factory=dict)
    links: set[LinkRow] = field(default_factory=set)
    placements: dict[str, PlacementRow] = field(default_factory=dict)  # by workload key tenant/group/name


def lock_fabric(session: Session) -> None:
    """Serialize fabric writers and tenant allocations: each reads the whole stored fabric, checks the
    result and writes it, so two must not interleave. SQLite's write transactions already hold the one
    writer lock (BEGIN IMMEDIATE); PostgreSQL takes a transaction-scoped advisory lock."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection().execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})


def read_rows(session: Session) -> FabricRows:
    conn = session.connection()
    out = FabricRows()
    for n in conn.execute(select(_nodes)):
        out.nodes[n.name] = (tuple(n.uplinks), tuple(n.host_ports))
    for s in conn.execute(select(_switches)):
        out.switches[s.name] = (s.role, tuple(s.ports), s.model)
    for x in conn.execute(select(_links)):
        out.links.add((x.leaf, x.leaf_port, x.peer, x.peer_port, x.peer_kind))
    for p in conn.execute(select(_placements)):
        out.placements[p.workload] = (p.node, p.port, p.ipv4, p.ipv6, tuple(p.selectors or ()))
    return out


def placements_on(session: Session, node: str) -> list[tuple[str, PlacementRow]]:
    """The placements on one node, by workload key."""
    rows = session.connection().execute(select(_placements).where(_placements.c.node == node)
                                        .order_by(_placements.c.workload))
    return [(p.workload, (p.node, p.port, p.ipv4, p.ipv6, tuple(p.selectors or ()))) for p in rows]


def _diff(old: Mapping[Any, Any], new: Mapping[Any, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    added = sorted(k for k in new if k not in old)
    removed = sorted(k for k in old if k not in new)
    changed = sorted(k for k in new if k in old and old[k] != new[k])
    return added, removed, changed


def names_summary(keys: list[Any]) -> dict[str, Any]:
    """{count, names}: the first MAX_NAMES names of a list, for an audit summary (events are bounded)."""
    shown = [k if isinstance(k, str) else f"{k[0]}:{k[1]}-{k[2]}:{k[3]}" for k in keys[:MAX_NAMES]]
    return {"count": len(keys), "names": shown}


def write(session: Session, desired: FabricRows, *, actor: Actor, action: str, object_id: str, now: datetime,
          request_id: str | None = None, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Make the stored fabric equal `desired` (checked by the caller) and record `action` with what changed;
    returns the changes ({kind: {added, removed, changed}}); nothing changed: nothing written, no event."""
    old = read_rows(session)
    conn = session.connection()
    changes: dict[str, Any] = {}
    stale_placements: list[str] = []
    fresh_placements: list[str] = []
    pairs: list[tuple[str, Mapping[Any, Any], Mapping[Any, Any]]] = [
        ("nodes", old.nodes, desired.nodes), ("switches", old.switches, desired.switches),
        ("links", {x: x for x in old.links}, {x: x for x in desired.links}),
        ("placements", old.placements, desired.placements)]
    for kind, before, after in pairs:
        added, removed, changed = _diff(before, after)
        if added or removed or changed:
            changes[kind] = {word: names_summary(keys) for word, keys in (("added", added), ("removed", removed),
                                                                          ("changed", changed)) if keys}
        if kind == "placements":  # deleted before any insert: an address or port may move between rows
            stale_placements, fresh_placements = removed + changed, added + changed
            continue
        gone = removed + changed
        if kind == "nodes" and gone:
            conn.execute(delete(_nodes).where(_nodes.c.name.in_(gone)))
        elif kind == "switches" and gone:
            conn.execute(delete(_switches).where(_switches.c.name.in_(gone)))
        elif kind == "links":
            for leaf, port, *_rest in removed:
                conn.execute(delete(_links).where(_links.c.leaf == leaf, _links.c.leaf_port == port))
        new = added + changed
        if kind == "nodes" and new:
            conn.execute(insert(_nodes), [{"name": k, "uplinks": list(after[k][0]), "host_ports": list(after[k][1]),
                                           "created_at": now} for k in new])
        elif kind == "switches" and new:
            conn.execute(insert(_switches), [{"name": k, "role": after[k][0], "ports": list(after[k][1]),
                                              "model": after[k][2], "created_at": now} for k in new])
        elif kind == "links" and new:
            conn.execute(insert(_links), [{"leaf": x[0], "leaf_port": x[1], "peer": x[2], "peer_port": x[3],
                                           "peer_kind": x[4], "created_at": now} for x in new])
    if stale_placements:
        conn.execute(delete(_placements).where(_placements.c.workload.in_(stale_placements)))
    if fresh_placements:
        conn.execute(insert(_placements), [
            {"workload": k, "tenant": k.split("/", 1)[0], "node": p[0], "port": p[1], "ipv4": p[2], "ipv6": p[3],
             "selectors": list(p[4]), "created_at": now}
            for k in fresh_placements for p in (desired.placements[k],)])
    if not changes and not summary:
        return changes
    record(session, actor=actor, action=action, object_type="fabric", object_id=object_id,
           tenant=_one_tenant(object_id, action), summary={**(summary or {}), "changes": changes},
           request_id=request_id, at=now)
    return changes


def _one_tenant(object_id: str, action: str) -> str | None:
    """A placement's event belongs to its workload's tenant too (tenant-filtered exports show it)."""
    return object_id.split("/", 1)[0] if action.startswith("workload.") and object_id.count("/") == 2 else None
