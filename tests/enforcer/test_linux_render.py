"""The Linux leaf rendering loads into real nftables (libnftables through pip-nftables) inside a network
namespace the test creates and deletes, as one atomic batch, and reads back with its sets and verdict map."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from enforcer.render.linux import render_linux
from enforcer.render.nvue import render_nvue
from tests.enforcer.helpers import compile_small

LOAD = (
    "import json,sys,nftables\n"
    "n=nftables.Nftables(); n.set_json_output(True)\n"
    "rc,out,err=n.json_cmd(json.load(sys.stdin))\n"
    "if rc: print(err, file=sys.stderr); sys.exit(1)\n"
    "rc,out,err=n.cmd('list table inet tf_leaf'); print(out)\n"
)


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("nft") is None:
        pytest.skip("needs root and nftables (Debian package nftables) to create a namespace")
    name = f"tfn{secrets.token_hex(3)}{os.getpid() % 1000}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_leaf_rules_load_atomically_into_nftables(netns: str) -> None:
    compiled, _ = compile_small()
    rs = compiled.devices["leaf:leaf2"]
    cfg = render_linux(rs, compiled.fabric)
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", LOAD], input=json.dumps(cfg.nft),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)["nftables"]
    sets = {x["set"]["name"]: x["set"] for x in listed if "set" in x}
    assert set(sets) == set(cfg.set_names)
    maps = [x["map"] for x in listed if "map" in x]
    assert maps[0]["name"] == "attach" and {e[0] for e in maps[0]["elem"]} == {p.name for p in rs.ports}
    rules = [x["rule"] for x in listed if "rule" in x]
    # one nft rule per IR rule and family that has members: never one per address pair
    assert len(rules) <= 1 + 2 * len(rs.rules)
    assert sum(1 for r in rules if r["chain"] == "acl_platform") == 3  # two return rules and the final drop
    # re-applying the same batch replaces the table in one transaction (add, delete, add): no duplicates
    again = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", LOAD], input=json.dumps(cfg.nft),
                           capture_output=True, text=True, timeout=60)
    assert len([x for x in json.loads(again.stdout)["nftables"] if "rule" in x]) == len(rules)


def test_routing_plays_the_vrfs() -> None:
    compiled, _ = compile_small()
    cfg = render_linux(compiled.devices["leaf:leaf2"], compiled.fabric)
    assert {(r["iif"], r["table"]) for r in cfg.ip_rules} == {("swp1.101", 10001), ("swp1.102", 10002),
                                                             ("swp2.100", 10000)}
    # acme's table on leaf2: its own w2 locally, w1 and db1 behind leaf1, and the leaked grant/platform routes
    acme = {r["dst"]: r for r in cfg.routes if r["table"] == 10001}
    assert acme["10.1.0.12/32"]["dev"] == "swp1.101"
    assert acme["10.1.0.11/32"]["via_leaf"] == "leaf1"
    assert acme["10.2.0.11/32"]["dev"] == "swp1.102"  # leaked from globex: the grant's destination
    assert acme["10.0.0.53/32"]["dev"] == "swp2.100"  # leaked from platform
    assert "10.2.0.21/32" not in acme  # globex/batch was never granted to acme


@pytest.mark.parametrize("field,value", [("action", "reject"), ("proto", "icmp"), ("port_side", "dest")])
def test_a_leaf_rule_outside_the_ir_vocabulary_is_refused_by_both_leaf_renderers(field: str, value: str) -> None:
    """Read by elimination, a port side "dest" was a source-port match (NVUE and nftables alike) and a protocol
    "icmp" an ICMP match with the rule's ports under it: each renderer refuses the rule set instead."""
    compiled, _ = compile_small()
    rs = compiled.devices["leaf:leaf1"]
    i = next(i for i, r in enumerate(rs.rules) if r.action == "allow" and r.ports)
    fields: dict[str, Any] = {field: value}
    odd = dataclasses.replace(rs, rules=(*rs.rules[:i], rs.rules[i]._replace(**fields), *rs.rules[i + 1:]))
    for render in (lambda: render_nvue(odd), lambda: render_linux(odd, compiled.fabric)):
        with pytest.raises(ValueError, match="cannot render"):
            render()


@pytest.mark.parametrize("fields", [
    {"action": "allow", "state": "established"},  # a NIC's conntrack-return rule: allow any to any
    {"direction": "egress"},
    {"state": "new"},
    {"src": "no-such-set"},  # a deny naming a set: one the set list lacks rendered as no entry at all
    {"proto": "*", "ports": ((443, 443),)},
])
def test_a_leaf_rule_outside_what_the_compiler_makes_is_refused(fields: dict[str, Any]) -> None:
    """The leaf renderers checked action, protocol and port side but read any direction as inbound and any state as
    stateless: the leaf's final deny turned into a NIC's `established` rule rendered as a permit-all entry (NVUE)
    and an accept-all rule (nftables), ahead of the tenant's whole ACL. Each renderer refuses such a rule set."""
    compiled, _ = compile_small()
    rs = compiled.devices["leaf:leaf1"]
    i = next(i for i, r in enumerate(rs.rules) if r.action == "deny")
    odd = dataclasses.replace(rs, rules=(rs.rules[i]._replace(**fields), *rs.rules))
    for render in (lambda: render_nvue(odd), lambda: render_linux(odd, compiled.fabric)):
        with pytest.raises(ValueError, match="cannot render"):
            render()
