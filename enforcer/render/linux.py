"""Leaf rule sets for the lab's Linux leaf (a network namespace): nftables JSON plus the routing tables and
`ip rule`s that play the VRFs (this kernel has no VRF devices: a VRF is a table selected by the ingress port).

nftables (one `inet` table per leaf, applied as one atomic batch by libnftables / pip-nftables):
  - the batch adds, deletes and re-adds the table, so it replaces the whole table in one transaction (no
    chain or set of a previous rule set survives it) and works whether the table exists or not;
  - one named set per address set and family (`s<i>_v4` / `s<i>_v6`, flags interval), in the order of
    `set_names` (the IR set name of each);
  - chain `forward` (hook forward, policy drop) dispatches on the ingress port through the verdict map
    `attach` (`iifname` -> jump to the tenant's ACL chain): no per-pair rules anywhere;
  - `attach` also maps the leaf's fabric-facing interfaces (`fabric_ports`: the lab's L3VNI vxlan devices)
    to accept: as on a Cumulus leaf, ACLs are bound inbound on tenant attachments, not on the fabric side;
  - chain `acl_<tenant>`: one rule per IR rule (sets for addresses, an anonymous set for ports), each with
    a counter and its reasons as the comment (counters map back to the policy rule or grant), ending in
    drop, the same order the leaf ACL has.
Interfaces are named as the IR names the attachments (`swp1.101`) unless `port_names` maps them to the
interface that realises the attachment (a Linux name holds at most 15 characters).
Routing: VRF = table <L3VNI>, `ip rule iif <port> lookup <table>` per attachment; in each table, a host route
per workload of the tenant (local: `dev <port>`; remote: `via_leaf`, which the lab resolves to its
inter-leaf link / vxlan with that VNI) and, for each leaked prefix, the route the source VRF has for it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from enforcer.fabric import Fabric
from enforcer.ir import ANY, DeviceRuleSet, FlowRule
from enforcer.render.nvue import check_leaf_rule

RULE_PRIORITY_BASE = 1000
COUNTER: dict[str, Any] = {"counter": None}


@dataclass(frozen=True)
class LinuxLeafConfig:
    nft: dict[str, Any]  # {"nftables": [...]} for libnftables' json_cmd
    ip_rules: tuple[dict[str, Any], ...]  # {"priority", "iif", "table"}
    routes: tuple[dict[str, Any], ...]  # {"table", "dst", "dev"} | {"table", "dst", "via_leaf", "vni"}
    set_names: dict[str, str]  # nft set -> IR address set


def _chain(tenant: str) -> str:
    return f"acl_{tenant}".replace("-", "_")


def _elems(cidrs: tuple[str, ...]) -> list[Any]:
    out: list[Any] = []
    for c in cidrs:
        n = ipaddress.ip_network(c)
        out.append({"prefix": {"addr": str(n.network_address), "len": n.prefixlen}})
    return out


def render_linux(rs: DeviceRuleSet, fabric: Fabric, table: str = "tf_leaf",
                 port_names: Mapping[str, str] | None = None, fabric_ports: Iterable[str] = ()) -> LinuxLeafConfig:
    if rs.kind != "leaf":
        raise ValueError(f"{rs.device} is not a leaf switch")
    names = dict(port_names or {})
    fam_t = {"family": "inet", "table": table}
    the_table = {"table": {"family": "inet", "name": table}}
    cmds: list[dict[str, Any]] = [{"add": the_table}, {"delete": the_table}, {"add": the_table}]
    set_ref: dict[tuple[str, int], str] = {}
    set_names: dict[str, str] = {}
    for i, s in enumerate(rs.sets):
        for fam, members in ((4, s.v4), (6, s.v6)):
            if not members:
                continue
            name = f"s{i}_v{fam}"
            set_ref[(s.name, fam)] = name
            set_names[name] = s.name
            cmds.append({"add": {"set": {**fam_t, "name": name, "type": f"ipv{fam}_addr",
                                         "flags": ["interval"], "elem": _elems(members)}}})
    tenants = sorted({r.scope for r in rs.rules})
    cmds.append({"add": {"chain": {**fam_t, "name": "forward", "type": "filter", "hook": "forward", "prio": 0,
                                   "policy": "drop"}}})
    for t in tenants:
        cmds.append({"add": {"chain": {**fam_t, "name": _chain(t)}}})
    cmds.append({"add": {"map": {**fam_t, "name": "attach", "type": "ifname", "map": "verdict",
                                 "elem": [[names.get(p.name, p.name), {"jump": {"target": _chain(p.tenant)}}]
                                          for p in rs.ports] + [[f, {"accept": None}] for f in fabric_ports]}}})
    cmds.append({"add": {"rule": {**fam_t, "chain": "forward", "expr": [
        {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@attach"}}]}}})
    for r in rs.rules:
        for expr in _exprs(r, set_ref):
            cmds.append({"add": {"rule": {**fam_t, "chain": _chain(r.scope), "expr": expr,
                                          "comment": " ".join(r.reasons)[:120]}}})
    ip_rules, routes = _routing(rs, fabric, names)
    return LinuxLeafConfig({"nftables": cmds}, ip_rules, routes, set_names)


def _exprs(r: FlowRule, set_ref: dict[tuple[str, int], str]) -> list[list[dict[str, Any]]]:
    check_leaf_rule(r)
    verdict = {"accept": None} if r.action == "allow" else {"drop": None}
    if r.src == ANY and r.dst == ANY and r.proto == "*":
        return [[COUNTER, verdict]]
    out = []
    for fam in (4, 6):
        proto_key = "ip" if fam == 4 else "ip6"
        parts: list[dict[str, Any]] = []
        ok = True
        for side, name in (("saddr", r.src), ("daddr", r.dst)):
            if name == ANY:
                continue
            ref = set_ref.get((name, fam))
            if ref is None:
                ok = False
                break
            parts.append({"match": {"op": "==", "left": {"payload": {"protocol": proto_key, "field": side}},
                                    "right": f"@{ref}"}})
        if not ok:
            continue
        if r.proto != "*":
            parts.append({"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": r.proto}})
        if r.ports:
            field = "dport" if r.port_side == "dst" else "sport"
            elems: list[Any] = [lo if lo == hi else {"range": [lo, hi]} for lo, hi in r.ports]
            parts.append({"match": {"op": "==", "left": {"payload": {"protocol": r.proto, "field": field}},
                                    "right": {"set": elems}}})
        out.append([*parts, COUNTER, verdict])
    return out


def _routing(rs: DeviceRuleSet, fabric: Fabric, names: Mapping[str, str]
             ) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    leaf = rs.name
    port_of = {(p.node, p.tenant): names.get(p.name, p.name) for p in rs.ports}
    vni_of = {v.name: v.vni for v in rs.vrfs}
    ip_rules = tuple({"priority": RULE_PRIORITY_BASE + i, "iif": port_of[(p.node, p.tenant)],
                      "table": vni_of[fabric.tenant[p.tenant].vrf]} for i, p in enumerate(rs.ports))

    by_tenant: dict[str, list[Any]] = {}
    for key, placements in fabric.members.items():
        by_tenant.setdefault(key.split("/", 1)[0], []).extend(placements)

    def route_to(tenant: str, prefix: str, table: int) -> list[dict[str, Any]]:
        net = ipaddress.ip_network(prefix)
        out = []
        for p in by_tenant.get(tenant, ()):
            for a in p.addresses():
                if ipaddress.ip_address(a) not in net:
                    continue
                host = f"{a}/{32 if ':' not in a else 128}"
                att = fabric.attachment[p.node]
                if att.leaf == leaf:
                    out.append({"table": table, "dst": host, "dev": port_of[(p.node, tenant)]})
                else:
                    out.append({"table": table, "dst": host, "via_leaf": att.leaf, "vni": fabric.tenant[tenant].vni})
        return out

    routes: list[dict[str, Any]] = []
    for v in rs.vrfs:
        for prefix in v.prefixes:
            routes.extend(route_to(v.tenant, prefix, v.vni))
        for lk in v.leaks:
            frm = next(x.tenant for x in rs.vrfs if x.name == lk.from_vrf)
            routes.extend(route_to(frm, lk.prefix, v.vni))
    uniq = {tuple(sorted(r.items())): r for r in routes}
    return ip_rules, tuple(uniq[k] for k in sorted(uniq))
