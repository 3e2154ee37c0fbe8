"""An independent renderer agrees: every leaf ACL of the small fabric, written as an Aerleon policy and rendered
by Aerleon's `nvueapi` generator (Capirca lineage, PyPI aerleon: a test dependency only), matches ours rule for
rule - same order, same action, protocol, source, destination and port.

Aerleon writes ports in the pre-5.7 NVUE form (`match.ip.dest-port`), we write the current one
(`match.ip.<proto>.dest-port.<port>`); both are normalised to one tuple per rule before comparing.
"""

from __future__ import annotations

from typing import Any

import pytest

from enforcer.cost import family_members
from enforcer.ir import ANY, DeviceRuleSet
from enforcer.render.nvue import render_nvue
from tests.enforcer.helpers import compile_small

aerleon_api = pytest.importorskip("aerleon.api", reason="aerleon is a test dependency (pip install aerleon)")
from aerleon.lib import naming  # noqa: E402

Norm = tuple[str, str | None, str | None, str | None, str | None, str | None]


def _ours(rule: dict[str, Any]) -> Norm:
    ip = rule.get("match", {}).get("ip", {})
    proto = ip.get("protocol")
    l4 = ip.get(proto, {}) if proto else {}
    dport = next(iter(l4.get("dest-port", {})), None)
    sport = next(iter(l4.get("source-port", {})), None)
    return (next(iter(rule["action"])), proto, ip.get("source-ip"), ip.get("dest-ip"), dport, sport)


def _theirs(rule: dict[str, Any]) -> Norm:
    ip = rule.get("match", {}).get("ip", {})
    return (next(iter(rule["action"])), ip.get("protocol"), ip.get("source-ip"), ip.get("dest-ip"),
            ip.get("dest-port"), ip.get("source-port"))


def _aerleon_acl(rs: DeviceRuleSet, tenant: str, family: int) -> list[Norm]:
    sets = rs.set_by_name
    networks: dict[str, Any] = {}
    services: dict[str, Any] = {}
    terms: list[dict[str, Any]] = []
    for i, r in enumerate(x for x in rs.rules if x.scope == tenant):
        term: dict[str, Any] = {"name": f"r{i}", "action": "accept" if r.action == "allow" else "deny"}
        if r.src != ANY or r.dst != ANY:
            src = family_members(sets[r.src], family)
            dst = family_members(sets[r.dst], family)
            if not src or not dst:
                continue  # nothing of this family: we emit no rule (Aerleon would emit an any-rule)
            networks[f"S{i}"] = {"values": [{"address": a} for a in src]}
            networks[f"D{i}"] = {"values": [{"address": a} for a in dst]}
            term.update({"source-address": f"S{i}", "destination-address": f"D{i}", "protocol": r.proto})
            if r.ports:
                services[f"P{i}"] = [{"port": str(lo) if lo == hi else f"{lo}-{hi}", "protocol": r.proto}
                                     for lo, hi in r.ports]
                term["destination-port" if r.port_side == "dst" else "source-port"] = f"P{i}"
        terms.append(term)
    defs = naming.Naming()
    defs.ParseDefinitionsObject({"networks": networks, "services": services}, "")
    name = f"tf-{tenant}-v{family}"
    target = f"{name} inet" if family == 4 else f"{name} inet6"  # aerleon needs an option
    policy = {"filename": "crosscheck", "filters": [{"header": {"targets": {"nvueapi": target}}, "terms": terms}]}
    out = aerleon_api.Generate([policy], defs)
    assert out is not None
    import json

    doc = json.loads(next(iter(out.values())))
    rules = doc["acl"][name]["rule"]
    return [_theirs(rules[k]) for k in sorted(rules, key=int)]


def test_every_leaf_acl_agrees_with_aerleon_rule_for_rule() -> None:
    compiled, _ = compile_small()
    compared = 0
    for rs in compiled.devices.values():
        if rs.kind != "leaf":
            continue
        doc = render_nvue(rs)
        for tenant in sorted({r.scope for r in rs.rules}):
            for family in (4, 6):
                ours = doc["acl"][f"tf-{tenant}-v{family}"]["rule"]
                mine = [_ours(ours[k]) for k in sorted(ours, key=int)]
                assert mine == _aerleon_acl(rs, tenant, family), (rs.device, tenant, family)
                compared += len(mine)
    assert compared >= 20  # both leaves, every tenant, both families
    # and the comparison can tell: one rule's port off by one is a difference
    rs = compiled.devices["leaf:leaf1"]
    acl = render_nvue(rs)["acl"]["tf-acme-v4"]["rule"]
    mine = [_ours(acl[k]) for k in sorted(acl, key=int)]
    mine[0] = (*mine[0][:4], "444", mine[0][5])
    assert mine != _aerleon_acl(rs, "acme", 4)
