"""Fabric changes (import, node/leaf/spine/link add and remove, workload placement) and tenant creation
with allocation: what the routes and the CLI both run.

Every change goes the same way: lock the fabric, read the stored fabric as a document
(`enforcer.fabric_db.stored_document`), merge the change onto it, check the whole result with the fabric
file's parser (`enforcer.fabric_file`: the same rules, and messages naming the field, for a file and for one
API call), then write the difference (`inventory.fabric.write`) with its audit event, all in the caller's
transaction: bad input writes nothing, an import is all or nothing.

What an import does with the sections beyond the fabric itself:
- tenants: created when new (display name = slug; missing VNI, VLAN, prefixes allocated from the pools); a
  stored tenant keeps its values: the file may repeat them or fill ones it lacks, never change them.
- groups and workloads: created / registered when new (their SPIFFE IDs derived as always); stored ones
  must agree (exposed ports, quarantine, revocation are changed through their own audited commands).
- quarantine and revocation flags: only as they are stored (a quarantine needs a reason, a revocation
  revokes SVIDs: both have their own commands).
- grants: never created by an import: grants go through request and approval. The file's grants are
  checked and named in the answer (`grants_not_imported`) so the operator can request them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session

from audit import Actor
from core.clock import Clock
from core.errors import Conflict, InvalidInput, NotFound
from core.quotas import Quotas
from enforcer.allocate import Pools, allocate
from enforcer.errors import FabricError
from enforcer.fabric import Fabric
from enforcer.fabric_db import stored_document, stored_tenants
from enforcer.fabric_file import load_fabric, load_fabric_value
from inventory import fabric as rows
from inventory import service as inventory
from inventory.errors import AlreadyExists
from inventory.models import Tenant

MAX_IMPORT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class FabricChange:
    changes: dict[str, Any]  # {nodes|switches|links|placements: {added, removed, changed: {count, names}}}
    tenants_created: list[str] = field(default_factory=list)
    tenants_allocated: list[str] = field(default_factory=list)
    groups_created: list[str] = field(default_factory=list)
    workloads_registered: list[str] = field(default_factory=list)
    grants_not_imported: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not (self.changes or self.tenants_created or self.tenants_allocated or self.groups_created
                    or self.workloads_registered)

    def to_dict(self) -> dict[str, Any]:
        return {"unchanged": self.unchanged, "changes": self.changes, "tenants_created": self.tenants_created,
                "tenants_allocated": self.tenants_allocated, "groups_created": self.groups_created,
                "workloads_registered": self.workloads_registered, "grants_not_imported": self.grants_not_imported}


@dataclass(frozen=True)
class Who:
    """Who changes the fabric, when, and the request (for the audit events); the per-tenant quotas the groups
    and workloads an import creates count against, as when created one by one (None: no limit)."""

    actor: Actor
    clock: Clock
    request_id: str | None = None
    quotas: Quotas | None = None


def _trust_domain(session: Session) -> str:
    from pki.service import trust_domain

    td = trust_domain(session)
    if td is None:
        raise Conflict("the trust domain is not initialised: run `trustfabric init` first")
    return td


def _apply(session: Session, who: Who, pools: Pools, action: str, object_id: str,
           check: Callable[[dict[str, Any]], Fabric], *, allow_new_inventory: bool = False,
           require_change: bool = True) -> FabricChange:
    rows.lock_fabric(session)
    td = _trust_domain(session)
    stored = stored_document(session, td)
    fabric = check(stored)
    created = _sync_inventory(session, stored, fabric, who, allow_new_inventory, td)
    desired = rows.FabricRows(
        nodes={n.name: (n.uplinks, n.host_ports) for n in fabric.nodes},
        switches={s.name: (s.role, s.ports, s.model) for s in fabric.switches},
        links={(x.leaf, x.leaf_port, x.peer, x.peer_port, x.peer_kind) for x in fabric.links},
        placements={p.workload: (p.node, p.port, p.ipv4, p.ipv6, p.selectors) for p in fabric.placements})
    summary = {k: rows.names_summary(v) for k, v in created.items() if v}
    changes = rows.write(session, desired, actor=who.actor, action=action, object_id=object_id, now=who.clock(),
                         request_id=who.request_id, summary=summary or None)
    out = FabricChange(changes, **created)
    if require_change and out.unchanged:
        raise AlreadyExists(f"{object_id}: nothing to change, the fabric already is like that")
    return out


def _sync_inventory(session: Session, stored: dict[str, Any], fabric: Fabric, who: Who, allow_new: bool,
                    td: str) -> dict[str, list[str]]:
    """Tenants, groups and workloads of the checked fabric against the stored ones: create the new ones (an
    import), fill allocated addressing, refuse any other difference (module docstring)."""
    out: dict[str, list[str]] = {"tenants_created": [], "tenants_allocated": [], "groups_created": [],
                                 "workloads_registered": []}
    kw = {"actor": who.actor, "clock": who.clock, "request_id": who.request_id}
    for t in fabric.tenants:
        have = stored["tenants"].get(t.slug)
        if have is None:
            _new_allowed(allow_new, f"tenant {t.slug}")
            prefix, prefix6 = _split_prefixes(t.prefixes)
            inventory.create_tenant(session, slug=t.slug, display_name=t.slug, l3vni=t.vni, vlan=t.vlan,
                                    prefix=prefix, prefix6=prefix6, **kw)  # type: ignore[arg-type]
            out["tenants_created"].append(t.slug)
            continue
        for name, flag in (("quarantined", t.quarantined), ("revoked", t.revoked)):
            if bool(have.get(name)) != flag:
                raise Conflict(f"tenants.{t.slug}.{name}: the stored tenant is {'' if have.get(name) else 'not '}"
                               f"{name}; change that with `trustfabric tenant quarantine` or `svid revoke`")
        prefix, prefix6 = _split_prefixes(t.prefixes)
        given = {"vni": t.vni, "vlan": t.vlan, "IPv4 prefix": prefix, "IPv6 prefix": prefix6}
        v4, v6 = _split_prefixes(tuple(have.get("prefixes", ())))
        stored_values = {"vni": have.get("vni"), "vlan": have.get("vlan"), "IPv4 prefix": v4, "IPv6 prefix": v6}
        for name, value in given.items():
            if stored_values[name] is not None and stored_values[name] != value:
                raise Conflict(f"tenants.{t.slug}: {name} {value} differs from the stored {stored_values[name]} "
                               "(an existing tenant's addressing never changes)")
        if given != stored_values:  # what the tenant lacked: given in the file or allocated from the pools
            inventory.fill_addressing(session, slug=t.slug, l3vni=t.vni, vlan=t.vlan, prefix=prefix, prefix6=prefix6,
                                      **kw)  # type: ignore[arg-type]
            out["tenants_allocated"].append(t.slug)
    for g in fabric.groups:
        have = stored["groups"].get(g.key)
        ports = sorted(f"{proto}/{p}" for proto, ps in g.exposed for p in ps)
        if have is None:
            _new_allowed(allow_new, f"group {g.key}")
            inventory.create_group(session, tenant=g.tenant, name=g.name,
                                   ports=[{"proto": p.split("/")[0], "port": int(p.split("/")[1])} for p in ports],
                                   quotas=who.quotas, **kw)  # type: ignore[arg-type]
            out["groups_created"].append(g.key)
            continue
        if have["ports"] != ports:
            raise Conflict(f"groups.{g.key}.ports: {ports} differ from the stored {have['ports']}")
        if have["quarantined"] != g.quarantined or g.revoked:
            raise Conflict(f"groups.{g.key}: quarantine and revocation are changed with their own commands")
    for w in fabric.workloads:
        have = stored["workloads"].get(w.key)
        if have is None:
            _new_allowed(allow_new, f"workload {w.key}")
            inventory.register_workload(session, trust_domain=td, tenant=w.tenant, group=w.group, name=w.name,
                                        quotas=who.quotas, **kw)  # type: ignore[arg-type]
            out["workloads_registered"].append(w.key)
        elif have["revoked"] != w.revoked:
            raise Conflict(f"workloads.{w.key}.revoked: revocation is changed with `trustfabric workload revoke`")
    return out


def _new_allowed(allowed: bool, what: str) -> None:
    if not allowed:  # only an import creates inventory; a single change refers to what exists
        raise NotFound(f"{what} does not exist")


def _split_prefixes(prefixes: tuple[str, ...]) -> tuple[str | None, str | None]:
    v4 = [p for p in prefixes if ":" not in p]
    v6 = [p for p in prefixes if ":" in p]
    if len(v4) > 1 or len(v6) > 1:
        raise InvalidInput(f"a tenant holds at most one IPv4 and one IPv6 prefix, not {list(prefixes)}")
    return (v4[0] if v4 else None), (v6[0] if v6 else None)


# ---------------------------------------------------------------- the operations


def import_fabric(session: Session, who: Who, pools: Pools, text: str | Mapping[str, Any], *,
                  source: str = "fabric.yaml") -> FabricChange:
    """Merge a fabric file (its text, or a document of its shape built in code) onto the stored fabric
    (module docstring); all or nothing."""
    if isinstance(text, str) and len(text.encode()) > MAX_IMPORT_BYTES:
        raise InvalidInput(f"{source}: a fabric file holds at most {MAX_IMPORT_BYTES // (1024 * 1024)} MiB")
    grants: list[str] = []

    def check(stored: dict[str, Any]) -> Fabric:
        fabric = (load_fabric(text, source=source, pools=pools, stored=stored) if isinstance(text, str)
                  else load_fabric_value(text, source, pools, stored))
        grants.extend(g.id for g in fabric.grants)
        return fabric

    out = _apply(session, who, pools, "fabric.import", source[:200], check, allow_new_inventory=True,
                 require_change=False)
    return FabricChange(out.changes, out.tenants_created, out.tenants_allocated, out.groups_created,
                        out.workloads_registered, sorted(grants))


def _single(session: Session, who: Who, pools: Pools, action: str, object_id: str, change: dict[str, Any],
            drop: Callable[[dict[str, Any]], None] | None = None) -> FabricChange:
    def check(stored: dict[str, Any]) -> Fabric:
        if drop is not None:
            drop(stored)
        return load_fabric_value({"trust_domain": stored["trust_domain"], **change}, pools=pools, stored=stored)

    return _apply(session, who, pools, action, object_id, check)


def _absent(stored: dict[str, Any], section: str, name: str, what: str) -> None:
    if name in stored[section]:
        raise AlreadyExists(f"{what} {name} already exists")


def add_node(session: Session, who: Who, pools: Pools, name: str, uplinks: list[str], host_ports: list[str]
             ) -> FabricChange:
    def drop(stored: dict[str, Any]) -> None:
        _absent(stored, "nodes", name, "node")

    return _single(session, who, pools, "fabric.node.add", name,
                   {"nodes": {name: {"nic": {"uplinks": uplinks, "host_ports": host_ports}}}}, drop)


def add_switch(session: Session, who: Who, pools: Pools, role: str, name: str, ports: list[str],
               model: str = "sn5600") -> FabricChange:
    section = {"leaf": "leaves", "spine": "spines"}.get(role)
    if section is None:
        raise InvalidInput(f"role must be leaf or spine, not {role!r}")

    def drop(stored: dict[str, Any]) -> None:
        _absent(stored, section, name, role)

    return _single(session, who, pools, f"fabric.{role}.add", name, {section: {name: {"ports": ports,
                                                                                     "model": model}}}, drop)


def remove_device(session: Session, who: Who, pools: Pools, kind: str, name: str) -> FabricChange:
    """Remove a node, leaf or spine with its cables; a node still hosting placed workloads is refused, and so
    is a leaf or spine whose removal leaves a placed workload's node without a leaf (the check names it)."""
    section = {"node": "nodes", "leaf": "leaves", "spine": "spines"}.get(kind)
    if section is None:
        raise InvalidInput(f"kind must be node, leaf or spine, not {kind!r}")

    def drop(stored: dict[str, Any]) -> None:
        if name not in stored[section]:
            raise NotFound(f"{kind} {name} does not exist")
        del stored[section][name]
        stored["links"] = [x for x in stored["links"] if not any(e.split(":", 1)[0] == name for e in x)]
        users = sorted(k for k, p in stored["placements"].items() if p["node"] == name)
        if users:
            raise Conflict(f"{kind} {name} still carries placed workloads: {', '.join(users[:10])}"
                           f"{' ...' if len(users) > 10 else ''} (move or unplace them first)")

    return _single(session, who, pools, f"fabric.{kind}.remove", name, {}, drop)


def link(session: Session, who: Who, pools: Pools, a: str, b: str, *, remove: bool = False) -> FabricChange:
    """Cable (or uncable) two ports, `<device>:<port>` each: a leaf to a node uplink or to a spine."""
    ends = sorted((a, b))
    if not remove:
        try:
            return _single(session, who, pools, "fabric.link.add", f"{ends[0]}-{ends[1]}", {"links": [[a, b]]})
        except FabricError as exc:
            raise FabricError(_named_by_ends(str(exc), a, b)) from None

    def drop(stored: dict[str, Any]) -> None:
        kept = [x for x in stored["links"] if sorted(x) != ends]
        if len(kept) == len(stored["links"]):
            raise NotFound(f"no cable joins {a} and {b}")
        stored["links"] = kept

    return _single(session, who, pools, "fabric.link.remove", f"{ends[0]}-{ends[1]}", {}, drop)


def _named_by_ends(message: str, a: str, b: str) -> str:
    """A refusal of the new cable said of the cable ('link leaf1:swp9 - gpu9:p0: leaf leaf1 has no port
    'swp9''), not of where the check found it: `request: links.6.0:` is the cable's place in the stored list
    merged with it, which the operator never sees. A refusal of a stored entry (`(stored)`) is left as it is."""
    where, sep, problem = message.removeprefix("request: ").partition(": ")
    if not message.startswith("request: ") or not sep or not where.startswith("links") or " " in where:
        return message
    return f"link {a} - {b}: {problem}"


def place_workload(session: Session, who: Who, pools: Pools, workload: str, *, node: str, port: str,
                   ipv4: str | None = None, ipv6: str | None = None, selectors: list[str] | None = None
                   ) -> FabricChange:
    """Place (or move) a registered workload on a node's host port with its addresses and selectors."""
    body: dict[str, Any] = {"node": node, "port": port}
    for name, value in (("ipv4", ipv4), ("ipv6", ipv6)):
        if value is not None:
            body[name] = value
    if selectors:
        body["selectors"] = selectors

    def drop(stored: dict[str, Any]) -> None:
        if workload not in stored["workloads"]:
            raise NotFound(f"workload {workload!r} is not registered (tenant/group/name)")
        stored["placements"].pop(workload, None)  # a move: the file's rule, the new placement replaces it

    return _single(session, who, pools, "workload.place", workload, {"placements": {workload: body}}, drop)


def unplace_workload(session: Session, who: Who, pools: Pools, workload: str) -> FabricChange:
    def drop(stored: dict[str, Any]) -> None:
        if stored["placements"].pop(workload, None) is None:
            raise NotFound(f"workload {workload!r} is not placed")

    return _single(session, who, pools, "workload.unplace", workload, {}, drop)


def create_tenant(session: Session, who: Who, pools: Pools, *, slug: str, display_name: str,
                  l3vni: int | None = None, vlan: int | None = None, prefix: str | None = None,
                  prefix6: str | None = None) -> Tenant:
    """A tenant with its L3VNI, VLAN and prefixes, the missing ones allocated from the pools; never two
    tenants on one VNI or VLAN, never overlapping prefixes (InvalidInput naming the clash)."""
    rows.lock_fabric(session)
    _trust_domain(session)
    stored = stored_tenants(session)
    if slug in stored:
        raise AlreadyExists(f"tenant {slug!r} already exists")
    import ipaddress

    partial: dict[str, dict[str, Any]] = {}
    for other, body in stored.items():
        entry: dict[str, Any] = {"prefixes": [ipaddress.ip_network(p) for p in body.get("prefixes", [])]}
        for k in ("vni", "vlan"):
            if body.get(k) is not None:
                entry[k] = body[k]
        partial[other] = entry
    mine: dict[str, Any] = {}
    try:
        nets = [ipaddress.ip_network(p, strict=True) for p in (prefix, prefix6) if p]
    except ValueError as exc:
        raise InvalidInput(f"prefix: {exc}") from None
    if nets:
        mine["prefixes"] = nets
    for k, v in (("vni", l3vni), ("vlan", vlan)):
        if v is not None:
            mine[k] = v
    partial[slug] = mine
    try:
        tenant = next(t for t in allocate(partial, pools) if t.slug == slug)
    except FabricError as exc:
        raise Conflict(str(exc)) from None
    v4, v6 = _split_prefixes(tenant.prefixes)
    return inventory.create_tenant(session, slug=slug, display_name=display_name, l3vni=tenant.vni, vlan=tenant.vlan,
                                   prefix=v4, prefix6=v6, actor=who.actor, clock=who.clock,
                                   request_id=who.request_id)
