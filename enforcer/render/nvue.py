"""Leaf rule sets as NVUE configuration (Cumulus Linux 5.x on Spectrum-4): the document `nv config patch`
takes, the equivalent `nv set` commands, and the JSON Schema of the subset emitted here
(`nvue_schema.json`, each field annotated with the NVUE command it comes from).

Per tenant VRF on the leaf: `vrf <vrf> table auto`, `evpn state enabled` + `evpn vni <L3VNI>`, route leaking
`router bgp address-family ipv4-unicast|ipv6-unicast route-import from-vrf list <vrf>` filtered by a
route-map that permits exactly the leaked prefixes (`router policy prefix-list` rules with
`max-prefix-len` = the prefix length, so nothing wider or narrower slips in). Per attachment: a
subinterface (`type sub`, `base-interface`, `vlan`) in the VRF with the tenant gateway address, and the
tenant's two ACLs (`tf-<tenant>-v4`, `tf-<tenant>-v6`) bound `inbound`. ACL rules hold one source-ip, one
dest-ip and one port (range) each - NVUE has no address sets - numbered in evaluation order, ending in a
deny.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from functools import cache
from importlib import resources
from typing import Any

import yaml

from enforcer.cost import family_members
from enforcer.ir import ANY, DeviceRuleSet, FlowRule

ACL_PREFIX = "tf-"
ROUTE_MAP_PREFIX = "tf-import-"
PREFIX_LIST_PREFIX = "tf-leak-"


def acl_name(tenant: str, family: int) -> str:
    return f"{ACL_PREFIX}{tenant}-v{family}"


def _port_key(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}:{hi}"


def check_leaf_rule(r: FlowRule) -> None:
    """ValueError unless the rule is one the compiler makes for a leaf: direction `inbound`, state `any`, action,
    protocol and port side each one of their values, ports only under tcp/udp, a deny only the final catch-all. A
    leaf renderer reads nothing else (fail closed): by elimination a port side "dest" was a source-port match, a
    NIC's `established` rule (allow any to any) a permit-all ACL entry, and a deny naming an unknown set no entry."""
    bad = (r.action not in ("allow", "deny") or r.proto not in ("tcp", "udp", "*") or r.port_side not in ("dst", "src")
           or r.direction != "inbound" or r.state != "any" or (r.ports and r.proto == ANY)
           or (r.action == "deny" and (r.src, r.dst, r.proto) != (ANY, ANY, ANY)))
    if bad:
        raise ValueError(f"a leaf rule set holds a rule it cannot render: direction {r.direction!r}, state "
                         f"{r.state!r}, action {r.action!r}, {r.src} > {r.dst}, proto {r.proto!r}, ports {r.ports}, "
                         f"port side {r.port_side!r}")


def acl_rules(rules: list[FlowRule], sets: dict[str, Any], family: int) -> list[dict[str, Any]]:
    """One tenant's ACL of one family: NVUE rule bodies in order (numbering is the caller's)."""
    out: list[dict[str, Any]] = []
    for r in rules:
        check_leaf_rule(r)
        if r.action == "deny" and r.src == ANY and r.dst == ANY:
            out.append({"action": {"deny": {}}, "remark": " ".join(r.reasons)})
            continue
        srcs = family_members(sets.get(r.src), family) if r.src != ANY else (None,)
        dsts = family_members(sets.get(r.dst), family) if r.dst != ANY else (None,)
        ports: list[tuple[int, int] | None] = list(r.ports) or [None]
        side = "dest-port" if r.port_side == "dst" else "source-port"
        for s in srcs or ():
            for d in dsts or ():
                for p in ports:
                    ip: dict[str, Any] = {}
                    if r.proto != "*":
                        ip["protocol"] = r.proto
                    if s is not None:
                        ip["source-ip"] = s
                    if d is not None:
                        ip["dest-ip"] = d
                    if p is not None:
                        ip[r.proto] = {side: {_port_key(*p): {}}}
                    out.append({"match": {"ip": ip}, "action": {"permit" if r.action == "allow" else "deny": {}},
                                "remark": " ".join(r.reasons)})
    return out


def _numbered(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    step = 10 if len(bodies) * 10 <= 65000 else 1
    return {str((i + 1) * step): b for i, b in enumerate(bodies)}


def _gateway(prefix: str) -> str:
    net = ipaddress.ip_network(prefix)
    return f"{net.network_address + 1}/{net.prefixlen}"


def render_nvue(rs: DeviceRuleSet) -> dict[str, Any]:
    """The `set` document (NVUE's object model) for one leaf."""
    if rs.kind != "leaf":
        raise ValueError(f"{rs.device} is not a leaf switch")
    sets = rs.set_by_name
    by_scope: dict[str, list[FlowRule]] = {}
    for r in rs.rules:
        by_scope.setdefault(r.scope, []).append(r)
    acl: dict[str, Any] = {}
    for tenant in sorted(by_scope):
        for fam in (4, 6):
            acl[acl_name(tenant, fam)] = {"type": f"ipv{fam}",
                                          "rule": _numbered(acl_rules(by_scope[tenant], sets, fam))}
    vrf_of = {v.tenant: v for v in rs.vrfs}
    interface: dict[str, Any] = {}
    for p in rs.ports:
        v = vrf_of[p.tenant]
        interface[p.name] = {
            "type": "sub", "base-interface": p.base, "vlan": p.vlan,
            "ip": {"vrf": v.name, "address": {_gateway(x): {} for x in v.prefixes}},
            "acl": {acl_name(p.tenant, 4): {"inbound": {}}, acl_name(p.tenant, 6): {"inbound": {}}},
        }
    vrf: dict[str, Any] = {}
    prefix_list: dict[str, Any] = {}
    route_map: dict[str, Any] = {}
    for v in rs.vrfs:
        body: dict[str, Any] = {"table": "auto", "evpn": {"state": "enabled", "vni": {str(v.vni): {}}}}
        afs: dict[str, Any] = {}
        for fam in (4, 6):
            leaks = [lk for lk in v.leaks if ipaddress.ip_network(lk.prefix).version == fam]
            if not leaks:
                continue
            rm = f"{ROUTE_MAP_PREFIX}{v.name}-v{fam}"
            sources = sorted({lk.from_vrf for lk in leaks})
            afs[f"ipv{fam}-unicast"] = {"route-import": {"from-vrf": {
                "state": "enabled", "list": {s: {} for s in sources}, "route-map": rm}}}
            rm_rules: dict[str, Any] = {}
            for i, src in enumerate(sources):
                pl = f"{PREFIX_LIST_PREFIX}{v.name}-{src}-v{fam}"
                nets = sorted({lk.prefix for lk in leaks if lk.from_vrf == src},
                              key=lambda x: ipaddress.ip_network(x))
                prefix_list[pl] = {"type": f"ipv{fam}", "rule": _numbered([
                    {"match": {n: {"max-prefix-len": ipaddress.ip_network(n).prefixlen}}, "action": "permit"}
                    for n in nets])}
                rm_rules[str((i + 1) * 10)] = {"match": {"type": f"ipv{fam}", "ip-prefix-list": pl},
                                               "action": {"permit": {}}}
            route_map[rm] = {"rule": rm_rules}
        if afs:
            body["router"] = {"bgp": {"address-family": afs}}
        vrf[v.name] = body
    doc: dict[str, Any] = {}
    if acl:
        doc["acl"] = acl
    if interface:
        doc["interface"] = interface
    if prefix_list or route_map:
        policy: dict[str, Any] = {}
        if prefix_list:
            policy["prefix-list"] = prefix_list
        if route_map:
            policy["route-map"] = route_map
        doc["router"] = {"policy": policy}
    if vrf:
        doc["vrf"] = vrf
    return doc


def _sort_key(k: str) -> tuple[int, int | str]:
    return (0, int(k)) if k.isdigit() else (1, k)


def _ordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _ordered(value[k]) for k in sorted(value, key=_sort_key)}
    return value


def nvue_yaml(rs: DeviceRuleSet) -> str:
    """The file `nv config patch <file>` applies: a list with one `set` of the document."""
    return str(yaml.safe_dump([{"set": _ordered(render_nvue(rs))}], sort_keys=False, default_flow_style=False,
                              width=1000))


def nv_set_commands(rs: DeviceRuleSet) -> list[str]:
    """The same configuration as `nv set` commands: one per leaf of the document."""
    out: list[str] = []

    def walk(prefix: list[str], value: Any) -> None:
        if isinstance(value, dict):
            if not value:
                out.append("nv set " + " ".join(prefix))
            for k in sorted(value, key=_sort_key):
                walk([*prefix, _quote(k)], value[k])
        else:
            out.append("nv set " + " ".join([*prefix, _quote(str(value))]))

    walk([], render_nvue(rs))
    return out


def _quote(word: str) -> str:
    """One shell word, whatever it holds (a remark may carry quotes, `$` or `;`): NVUE's reference asks
    multi-word values to be quoted, and a word wrapped in quotes it contains would break the command line."""
    return shlex.quote(word)


@cache
def nvue_schema() -> dict[str, Any]:
    """The JSON Schema of the NVUE subset render_nvue emits."""
    text = resources.files("enforcer.render").joinpath("nvue_schema.json").read_text()
    return dict(json.loads(text))


def validate_nvue(doc: dict[str, Any]) -> list[str]:
    """Schema violations of a `set` document (empty: valid)."""
    import jsonschema_rs

    validator = jsonschema_rs.validator_for(nvue_schema())
    return [f"{'/'.join(map(str, e.instance_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(doc)]
