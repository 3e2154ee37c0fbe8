"""The fabric YAML file: strict parsing that names the file, line and field of every mistake.

Read by `trustfabric fabric import FILE.yaml` and `trustfabric lab up FILE.yaml`. Sections (all optional
but `trust_domain`; unknown keys are errors, never ignored):

    trust_domain: example.org
    tenants:    {<slug>: {vni, vlan, prefixes: [cidr...], quarantined, revoked}}   # vni/vlan/prefixes
                                                                                    # allocated when absent
    groups:     {<tenant>/<group>: {ports: ["tcp/443", ...], quarantined, revoked}}
    workloads:  {<tenant>/<group>/<name>: {revoked} | null}
    nodes:      {<name>: {uplinks: [p0], host_ports: [pf0vf0, ...]}}
    leaves:     {<name>: {ports: [swp1, ...], model}}
    spines:     {<name>: {ports: [swp1, ...], model}}
    links:      [[<leaf>:<port>, <node or spine>:<port>], ...]
    placements: {<tenant>/<group>/<name>: {node, port, ipv4, ipv6, selectors: [unix:uid:1001, ...]}}
    grants:     {<id>: {src: <tenant>/<group>, dst: <tenant>/<group>, proto, ports: [int], expires_at}}

When the file carries no `workloads` section the caller may pass the known workloads (from the database);
a placement of a workload nobody knows is an error either way.

`stored` (the database's fabric, as a document of the same shape) is what the file is merged onto, and the
whole result is checked: a file entry for a stored tenant, group or workload overrides only the fields it
gives; a stored node, switch or placement the file names is replaced by the file's; links are the union
(a file link equal to a stored one is the same cable; one that reuses a cabled port is an error). A
mistake in a stored entry (one the file broke, e.g. a node redefined without the uplink a stored cable
uses) is named with `(stored)` instead of a line. `load_fabric_value` checks a document built in code
(the API's single changes) the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from core.digits import is_digits
from core.slugs import is_slug
from core.yaml_bound import value_budget
from enforcer.allocate import Pools, allocate
from enforcer.errors import FabricError
from enforcer.fabric import (
    PROTOS,
    Fabric,
    Grant,
    Group,
    Link,
    Placement,
    Switch,
    Tenant,
    Workload,
)
from enforcer.fabric import (
    Node as GpuNode,
)
from pki.errors import InvalidSelector, InvalidSpiffeId
from pki.selectors import normalize_selectors
from pki.spiffe_id import validate_segment, validate_trust_domain

Path_ = tuple[str, ...]
_SECTIONS = ("trust_domain", "tenants", "groups", "workloads", "nodes", "leaves", "spines", "links", "placements",
             "grants")
_OVERLAID = ("tenants", "groups", "workloads")  # a file entry for a stored one overrides only what it gives


class _Doc:
    """The YAML document as plain values, with the line of every key and item kept for messages."""

    def __init__(self, text: str | None, source: str, value: Any = None) -> None:
        self.source = source
        self.lines: dict[Path_, int] = {}
        self.stored: set[Path_] = set()  # entries merged in from the stored fabric (no line to name)
        self._constructor = SafeConstructor()
        self.value: Any
        if text is None:  # a document built in code
            self.value = value
            return
        # YAML aliases share a node, which _plain expands at every reference: nested ones were a few hundred bytes for
        # billions of values (core/yaml_bound.py: how far a document of this size may expand)
        self._limit = self._budget = value_budget(len(text))
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"{mark.line + 1}" if mark is not None else "?"
            raise FabricError(f"{source}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        self.value = {} if root is None else self._plain(root, ())

    def _plain(self, node: Node, path: Path_) -> Any:
        self._budget -= 1
        if self._budget < 0:
            self.fail(path, f"the file's YAML aliases expand it beyond {self._limit} values")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, MappingNode):
            out: dict[str, Any] = {}
            for k, v in node.value:
                if not isinstance(k, ScalarNode):
                    self.fail(path, "keys must be plain strings")
                key = str(k.value)
                if key in out:
                    self.lines[(*path, key)] = k.start_mark.line + 1
                    self.fail((*path, key), "duplicate key")
                self.lines[(*path, key)] = k.start_mark.line + 1
                out[key] = self._plain(v, (*path, key))
            return out
        if isinstance(node, SequenceNode):
            return [self._plain(v, (*path, str(i))) for i, v in enumerate(node.value)]
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # a scalar YAML has no constructor for, e.g. `=` (the `value` tag)
            self.fail(path, f"not a value this file can hold: {getattr(exc, 'problem', exc)}")

    def fail(self, path: Path_, message: str) -> NoReturn:
        where = ".".join(path) or "(top)"
        if path[:2] in self.stored:
            raise FabricError(f"{self.source}: {where} (stored): {message}")
        line = next((self.lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in self.lines), None)
        raise FabricError(f"{self.source}:{line}: {where}: {message}" if line is not None
                          else f"{self.source}: {where}: {message}")

    def merge(self, stored: Mapping[str, Any]) -> None:
        """Put the stored fabric under the file (see the module docstring for the rule)."""
        top = self.value if isinstance(self.value, dict) else {}
        if not isinstance(self.value, dict):
            self.value = top
        if "trust_domain" in stored and "trust_domain" in top and top["trust_domain"] != stored["trust_domain"]:
            self.fail(("trust_domain",), f"is {top['trust_domain']!r}, but this fabric's trust domain is "
                                         f"{stored['trust_domain']!r}")
        for section in _SECTIONS:
            if section in ("trust_domain", "links") or not stored.get(section):
                continue
            mine = top.get(section)
            if mine is None:
                mine = top[section] = {}
            if not isinstance(mine, dict):
                continue  # the parser names the file's mistake
            merged: dict[str, Any] = {}
            for key, body in stored[section].items():
                if key not in mine:
                    merged[key] = body
                    self.stored.add((section, key))
                elif section in _OVERLAID and isinstance(mine[key], dict) and isinstance(body, dict):
                    mine[key] = {**body, **mine[key]}
            top[section] = {**merged, **mine}
        links = stored.get("links") or []
        if links:
            mine_links = top.get("links")
            own = mine_links if isinstance(mine_links, list) else []
            cables = {frozenset(map(str, x)) for x in links}
            fresh = [x for x in own if not (isinstance(x, list) and frozenset(map(str, x)) in cables)]
            top["links"] = [*links, *fresh] if isinstance(mine_links, list) or mine_links is None else mine_links
            self.stored.update(("links", str(i)) for i in range(len(links)))


def _mapping(doc: _Doc, value: Any, path: Path_, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        doc.fail(path, f"must be a mapping, not {type(value).__name__}")
    if allowed is not None:
        allowed = tuple(allowed)
        for key in value:
            if key not in allowed:
                doc.fail((*path, key), f"unknown field (expected one of: {', '.join(allowed)})")
    return value


def _list(doc: _Doc, value: Any, path: Path_) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        doc.fail(path, f"must be a list, not {type(value).__name__}")
    return value


def _bool(doc: _Doc, value: Any, path: Path_) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        doc.fail(path, "must be true or false")
    return value


def _int(doc: _Doc, value: Any, path: Path_, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        doc.fail(path, f"must be an integer {lo}-{hi}, not {value!r}")
    return value


def _name(doc: _Doc, value: Any, path: Path_, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 63 or any(c.isspace() for c in value):
        doc.fail(path, f"{what} must be a non-empty name without spaces (at most 63 characters)")
    return value


def _slug(doc: _Doc, value: str, path: Path_, what: str) -> str:
    if not is_slug(value):
        doc.fail(path, f"{what} {value!r} is not a DNS label (lowercase letters, digits, '-')")
    return value


def _parts(doc: _Doc, key: str, path: Path_, n: int, what: str) -> list[str]:
    parts = key.split("/")
    if len(parts) != n:
        doc.fail(path, f"{what} must be written {'/'.join(['<tenant>', '<group>', '<name>'][:n])}")
    for p in parts[:2]:
        _slug(doc, p, path, "tenant/group name")
    if n == 3:
        try:
            validate_segment(parts[2], "workload name")
        except InvalidSpiffeId as exc:
            doc.fail(path, str(exc))
    return parts


def load_fabric_file(path: str | Path, **kwargs: Any) -> Fabric:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise FabricError(f"{p}: cannot read: {exc.strerror}") from None
    return load_fabric(text, source=str(p), **kwargs)


def load_fabric(text: str, source: str = "<fabric>", known_workloads: Iterable[Workload] | None = None,
                pools: Pools | None = None, known_tenants: Iterable[Tenant] = (),
                known_groups: Iterable[Group] = (), stored: Mapping[str, Any] | None = None) -> Fabric:
    """A validated Fabric, or FabricError naming the first problem (file:line: field: what is wrong)."""
    return _load(_Doc(text, source), known_workloads, pools, known_tenants, known_groups, stored)


def load_fabric_value(value: Mapping[str, Any], source: str = "request", pools: Pools | None = None,
                      stored: Mapping[str, Any] | None = None) -> Fabric:
    """load_fabric for a document built in code (plain values of the file's shape, deep-copied first)."""
    import copy

    return _load(_Doc(None, source, copy.deepcopy(dict(value))), None, pools, (), (), stored)


def _load(doc: _Doc, known_workloads: Iterable[Workload] | None, pools: Pools | None,
          known_tenants: Iterable[Tenant], known_groups: Iterable[Group], stored: Mapping[str, Any] | None
          ) -> Fabric:
    if stored is not None:
        doc.merge(stored)
    top = _mapping(doc, doc.value, (), _SECTIONS)
    td = top.get("trust_domain")
    if not isinstance(td, str):
        doc.fail(("trust_domain",), "is required (the SPIFFE trust domain, e.g. example.org)")
    try:
        validate_trust_domain(td)
    except InvalidSpiffeId as exc:
        doc.fail(("trust_domain",), str(exc))

    tenants = _tenants(doc, top.get("tenants"), pools or Pools(), list(known_tenants))
    groups = _groups(doc, top.get("groups"), tenants, list(known_groups))
    workloads = _workloads(doc, top, groups, known_workloads)
    nodes = _nodes(doc, top.get("nodes"))
    switches = _switches(doc, top.get("leaves"), "leaf") + _switches(doc, top.get("spines"), "spine")
    links = _links(doc, top.get("links"), nodes, switches)
    fabric = Fabric(trust_domain=td, tenants=tenants, groups=groups, workloads=workloads, nodes=nodes,
                    switches=switches, links=links)
    placements = _placements(doc, top.get("placements"), fabric)
    grants = _grants(doc, top.get("grants"), fabric)
    return replace(fabric, placements=placements, grants=grants)


def _tenants(doc: _Doc, raw: Any, pools: Pools, known: list[Tenant]) -> tuple[Tenant, ...]:
    section = _mapping(doc, raw, ("tenants",))
    partial: dict[str, dict[str, Any]] = {}
    for t in known:
        partial[t.slug] = {"vni": t.vni, "vlan": t.vlan, "prefixes": list(t.networks()),
                           "quarantined": t.quarantined, "revoked": t.revoked}
    for slug, body in section.items():
        path = ("tenants", slug)
        _slug(doc, slug, path, "tenant")
        body = _mapping(doc, body, path, ("vni", "vlan", "prefixes", "quarantined", "revoked"))
        entry: dict[str, Any] = {**partial.get(slug, {}),
                                 "quarantined": _bool(doc, body.get("quarantined"), (*path, "quarantined")),
                                 "revoked": _bool(doc, body.get("revoked"), (*path, "revoked"))}
        if "vni" in body:
            entry["vni"] = _int(doc, body["vni"], (*path, "vni"), 1, 16_777_215)
        if "vlan" in body:
            entry["vlan"] = _int(doc, body["vlan"], (*path, "vlan"), 2, 4094)
        if "prefixes" in body:
            nets = []
            for i, text in enumerate(_list(doc, body["prefixes"], (*path, "prefixes"))):
                try:
                    nets.append(ipaddress.ip_network(str(text), strict=True))
                except ValueError as exc:
                    doc.fail((*path, "prefixes", str(i)), f"not a network prefix: {exc}")
            entry["prefixes"] = nets
        partial[slug] = entry
    try:
        return allocate(partial, pools)
    except FabricError as exc:
        doc.fail(("tenants",), str(exc))


def _ports(doc: _Doc, raw: Any, path: Path_) -> tuple[tuple[str, tuple[int, ...]], ...]:
    by: dict[str, set[int]] = {}
    for i, item in enumerate(_list(doc, raw, path)):
        text = str(item)
        proto, _, port = text.partition("/")
        if proto not in PROTOS or not is_digits(port) or not 1 <= int(port) <= 65535:
            doc.fail((*path, str(i)), f"{text!r} must be <tcp|udp>/<1-65535>")
        by.setdefault(proto, set()).add(int(port))
    return tuple((p, tuple(sorted(ports))) for p, ports in sorted(by.items()))


def _groups(doc: _Doc, raw: Any, tenants: tuple[Tenant, ...], known: list[Group]) -> tuple[Group, ...]:
    slugs = {t.slug for t in tenants}
    out = {g.key: g for g in known}
    for key, body in _mapping(doc, raw, ("groups",)).items():
        path = ("groups", key)
        tenant, name = _parts(doc, key, path, 2, "a group")
        if tenant not in slugs:
            doc.fail(path, f"unknown tenant {tenant!r}")
        body = _mapping(doc, body, path, ("ports", "quarantined", "revoked"))
        out[key] = Group(tenant, name, _ports(doc, body.get("ports"), (*path, "ports")),
                         _bool(doc, body.get("quarantined"), (*path, "quarantined")),
                         _bool(doc, body.get("revoked"), (*path, "revoked")))
    return tuple(sorted(out.values(), key=lambda g: g.key))


def _workloads(doc: _Doc, top: Mapping[str, Any], groups: tuple[Group, ...],
               known: Iterable[Workload] | None) -> tuple[Workload, ...]:
    keys = {g.key for g in groups}
    out = {w.key: w for w in (known or ())}
    for key, body in _mapping(doc, top.get("workloads"), ("workloads",)).items():
        path = ("workloads", key)
        tenant, group, name = _parts(doc, key, path, 3, "a workload")
        if f"{tenant}/{group}" not in keys:
            doc.fail(path, f"unknown group {tenant}/{group}")
        body = _mapping(doc, body, path, ("revoked",))
        out[key] = Workload(tenant, group, name, _bool(doc, body.get("revoked"), (*path, "revoked")))
    return tuple(sorted(out.values(), key=lambda w: w.key))


def _port_names(doc: _Doc, raw: Any, path: Path_) -> tuple[str, ...]:
    names = [_name(doc, v, (*path, str(i)), "a port") for i, v in enumerate(_list(doc, raw, path))]
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            doc.fail((*path, str(i)), f"port {n!r} is listed twice")
        seen.add(n)
    return tuple(names)


def _nodes(doc: _Doc, raw: Any) -> tuple[GpuNode, ...]:
    out = []
    for name, body in _mapping(doc, raw, ("nodes",)).items():
        path = ("nodes", name)
        _slug(doc, name, path, "node")
        body = _mapping(doc, body, path, ("nic",))
        nic = _mapping(doc, body.get("nic"), (*path, "nic"), ("uplinks", "host_ports", "model"))
        uplinks = _port_names(doc, nic.get("uplinks"), (*path, "nic", "uplinks"))
        hosts = _port_names(doc, nic.get("host_ports"), (*path, "nic", "host_ports"))
        if not uplinks:
            doc.fail((*path, "nic", "uplinks"), "a SuperNIC needs at least one uplink port")
        if set(uplinks) & set(hosts):
            doc.fail((*path, "nic"), f"ports {sorted(set(uplinks) & set(hosts))} are both uplink and host ports")
        out.append(GpuNode(name, uplinks, hosts))
    return tuple(sorted(out, key=lambda n: n.name))


def _switches(doc: _Doc, raw: Any, role: str) -> tuple[Switch, ...]:
    section = "leaves" if role == "leaf" else "spines"
    out = []
    for name, body in _mapping(doc, raw, (section,)).items():
        path = (section, name)
        _slug(doc, name, path, role)
        body = _mapping(doc, body, path, ("ports", "model"))
        model = str(body.get("model", "sn5600"))
        out.append(Switch(name, "leaf" if role == "leaf" else "spine", _port_names(doc, body.get("ports"),
                                                                                    (*path, "ports")), model))
    return tuple(sorted(out, key=lambda s: s.name))


def _links(doc: _Doc, raw: Any, nodes: tuple[GpuNode, ...], switches: tuple[Switch, ...]) -> tuple[Link, ...]:
    node_by = {n.name: n for n in nodes}
    sw_by = {s.name: s for s in switches}
    if set(node_by) & set(sw_by):
        doc.fail(("nodes",), f"names used by both a node and a switch: {sorted(set(node_by) & set(sw_by))}")
    used: dict[tuple[str, str], tuple[int, str]] = {}
    out = []
    for i, item in enumerate(_list(doc, raw, ("links",))):
        path = ("links", str(i))
        if not isinstance(item, list) or len(item) != 2:
            doc.fail(path, "a link is a pair [<device>:<port>, <device>:<port>]")
        ends = []
        for j, end in enumerate(item):
            dev, sep, port = str(end).partition(":")
            if not sep or not dev or not port:
                doc.fail((*path, str(j)), f"{end!r} must be <device>:<port>")
            if dev in node_by:
                if port not in node_by[dev].uplinks:
                    doc.fail((*path, str(j)), f"node {dev} has no uplink port {port!r} "
                                              f"(uplinks: {', '.join(node_by[dev].uplinks)})")
                kind = "node"
            elif dev in sw_by:
                if port not in sw_by[dev].ports:
                    doc.fail((*path, str(j)), f"{sw_by[dev].role} {dev} has no port {port!r}")
                kind = sw_by[dev].role
            else:
                doc.fail((*path, str(j)), f"unknown device {dev!r} (not a node, leaf or spine)")
            if (dev, port) in used:
                at, other = used[(dev, port)]
                doc.fail((*path, str(j)), f"{dev}:{port} is already cabled to {other} (links.{at})")
            used[(dev, port)] = (i, str(item[1 - j]))
            ends.append((kind, dev, port))
        ends.sort(key=lambda e: {"leaf": 0, "spine": 1, "node": 2}[e[0]])
        (k1, d1, p1), (k2, d2, p2) = ends
        if k1 != "leaf" or k2 == "leaf":
            doc.fail(path, "a link joins a leaf to a node uplink or to a spine")
        out.append(Link(d1, p1, d2, p2, "node" if k2 == "node" else "spine"))
    return tuple(sorted(out))


def _placements(doc: _Doc, raw: Any, fabric: Fabric) -> tuple[Placement, ...]:
    by_addr: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, str] = {}
    by_port: dict[tuple[str, str], str] = {}
    out = []
    for key, body in _mapping(doc, raw, ("placements",)).items():
        path = ("placements", key)
        tenant_slug, _group, _name = _parts(doc, key, path, 3, "a placement")
        if key not in fabric.workload:
            doc.fail(path, f"unknown workload {key!r}")
        body = _mapping(doc, body, path, ("node", "port", "ipv4", "ipv6", "selectors"))
        node_name = body.get("node")
        if node_name not in fabric.node:
            doc.fail((*path, "node"), f"unknown node {node_name!r}")
        node = fabric.node[str(node_name)]
        if node.name not in fabric.attachment:
            doc.fail((*path, "node"), f"node {node.name} has no uplink cabled to a leaf")
        port = body.get("port")
        if port not in node.host_ports:
            doc.fail((*path, "port"), f"node {node.name} has no host port {port!r} "
                                      f"(host ports: {', '.join(node.host_ports) or 'none'})")
        if (node.name, str(port)) in by_port:
            doc.fail((*path, "port"), f"{node.name}:{port} already carries {by_port[(node.name, str(port))]}")
        by_port[(node.name, str(port))] = key
        tenant = fabric.tenant[tenant_slug]
        addrs: dict[str, str | None] = {"ipv4": None, "ipv6": None}
        for fam, version in (("ipv4", 4), ("ipv6", 6)):
            if body.get(fam) is None:
                continue
            try:
                addr = ipaddress.ip_address(str(body[fam]))
            except ValueError:
                doc.fail((*path, fam), f"{body[fam]!r} is not an IP address")
            if addr.version != version:
                doc.fail((*path, fam), f"{addr} is not an IPv{version} address")
            nets = [n for n in tenant.networks() if n.version == version]
            if not any(addr in n for n in nets):
                doc.fail((*path, fam), f"{addr} is outside tenant {tenant.slug}'s prefixes "
                                       f"({', '.join(map(str, nets)) or f'no IPv{version} prefix'})")
            if addr in by_addr:
                doc.fail((*path, fam), f"duplicate address {addr}: already placed for {by_addr[addr]}")
            by_addr[addr] = key
            addrs[fam] = str(addr)
        if addrs["ipv4"] is None and addrs["ipv6"] is None:
            doc.fail(path, "a placement needs an ipv4 and/or an ipv6 address")
        try:
            selectors = normalize_selectors(map(str, _list(doc, body.get("selectors"), (*path, "selectors"))))
        except InvalidSelector as exc:
            doc.fail((*path, "selectors"), str(exc))
        out.append(Placement(key, node.name, str(port), addrs["ipv4"], addrs["ipv6"], selectors))
    return tuple(sorted(out, key=lambda p: p.workload))


def _grants(doc: _Doc, raw: Any, fabric: Fabric) -> tuple[Grant, ...]:
    out = []
    for gid, body in _mapping(doc, raw, ("grants",)).items():
        path = ("grants", gid)
        _name(doc, gid, path, "a grant id")
        body = _mapping(doc, body, path, ("src", "dst", "proto", "ports", "expires_at"))
        ends = []
        for side in ("src", "dst"):
            key = str(body.get(side))
            t, g = _parts(doc, key, (*path, side), 2, f"grant {side}")
            if key not in fabric.group:
                doc.fail((*path, side), f"unknown group {key!r}")
            ends.append((t, g))
        if ends[0][0] == ends[1][0]:
            doc.fail(path, "a grant joins two different tenants (intra-tenant flows need no grant)")
        proto = body.get("proto")
        if proto not in PROTOS:
            doc.fail((*path, "proto"), "must be tcp or udp")
        ports = tuple(sorted({_int(doc, p, (*path, "ports", str(i)), 1, 65535)
                              for i, p in enumerate(_list(doc, body.get("ports"), (*path, "ports")))}))
        if not ports:
            doc.fail((*path, "ports"), "a grant names at least one port")
        exp = body.get("expires_at")
        if isinstance(exp, date) and not isinstance(exp, datetime):
            doc.fail((*path, "expires_at"), "must be a timestamp with a time zone, e.g. 2030-01-01T00:00:00Z")
        if not isinstance(exp, datetime) or exp.tzinfo is None:
            doc.fail((*path, "expires_at"), "must be a timestamp with a time zone, e.g. 2030-01-01T00:00:00Z")
        out.append(Grant(gid, ends[0][0], ends[0][1], ends[1][0], ends[1][1], str(proto), ports,
                         exp.astimezone(UTC)))
    return tuple(sorted(out, key=lambda g: g.id))
