"""The Linux leaf backend beyond the shared conformance test, in a network namespace the test creates:
routing converges (stale VRF routes and rules go, nothing outside our priorities is touched), a batch that
nftables refuses takes the routing it had added back with it, hand edits show up as drift, counters read
back per rule with their reasons, and read-back agrees with the rendering on generated fabrics."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.compiler import compile_fabric, recompile
from enforcer.errors import ApplyError, NotApplied
from enforcer.fabric import Fabric, revoked_ids
from enforcer.ir import DeviceRuleSet
from enforcer.netns import run_in
from tests.enforcer.gen import fabrics
from tests.enforcer.helpers import allowed_flows, compile_small
from tests.enforcer.test_backends import overlapping

GRANT = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [5432], "reason": "grant:new",
         "sources": ["globex/batch"]}


def _need_root() -> None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, nftables and iproute2 to create a network namespace")


def _ip(ns: str, *args: str, batch: str | None = None) -> str:
    return subprocess.run(["ip", "-n", ns, *args], input=batch, text=True, check=True, capture_output=True).stdout


class Leaf:
    """A namespace with the interfaces a leaf rule set names (veths, one vxlan device per VNI)."""

    def __init__(self, fabric: Fabric, ports: list[str], remote_leaves: list[str]) -> None:
        self.ns = f"tfc{secrets.token_hex(3)}{os.getpid() % 1000}"
        self.vnis = sorted(t.vni for t in fabric.tenants)
        lines = ["link set lo up", "addr add 100.127.0.1/32 dev lo"]
        lines += [f"link add {p} type veth peer name y{i}" for i, p in enumerate(ports)]
        lines += [f"link set {p} up" for p in ports]
        for vni in self.vnis:
            lines += [f"link add vx{vni} type vxlan id {vni} local 100.127.0.1 dstport 4789 nolearning",
                      f"link set vx{vni} up"]
        subprocess.run(["ip", "netns", "add", self.ns], check=True, capture_output=True)
        _ip(self.ns, "-batch", "-", batch="\n".join(lines) + "\n")
        vteps = {leaf: f"100.127.0.{i + 2}" for i, leaf in enumerate(remote_leaves)}
        self.wiring = LeafWiring(l3vni={v: f"vx{v}" for v in self.vnis}, vteps=vteps, gateway_v4="169.254.0.1")
        self.backend = LinuxBackend(self.ns, fabric, self.wiring)

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


@pytest.fixture
def leaf1() -> Iterator[tuple[Leaf, DeviceRuleSet, DeviceRuleSet]]:
    _need_root()
    compiled, allowed = compile_small()
    a = compiled.devices["leaf:leaf1"]
    b = recompile(compiled, [*allowed, GRANT]).devices["leaf:leaf1"]
    leaf = Leaf(compiled.fabric, [p.name for p in a.ports], ["leaf2"])
    try:
        yield leaf, a, b
    finally:
        leaf.close()


def _routes(ns: str, table: int) -> set[str]:
    return {r["dst"] for fam in ("-4", "-6") for r in json.loads(_ip(ns, fam, "-j", "route", "show", "table",
                                                                        str(table)) or "[]")}


def test_routing_converges_both_ways_and_leaves_foreign_rules_alone(leaf1: tuple[Leaf, DeviceRuleSet,
                                                                                 DeviceRuleSet]) -> None:
    leaf, a, b = leaf1
    _ip(leaf.ns, "rule", "add", "priority", "500", "iif", "y0", "lookup", "77")  # not ours: below our range
    leaf.backend.apply(a)
    assert "10.2.0.21" not in _routes(leaf.ns, 10001)  # globex/batch is not in acme's VRF
    leaf.backend.apply(b)
    assert "10.2.0.21" in _routes(leaf.ns, 10001)  # the grant leaks it in
    assert "10.1.0.21" in _routes(leaf.ns, 10002)  # and acme/data back into globex's VRF
    leaf.backend.apply(a)
    assert "10.2.0.21" not in _routes(leaf.ns, 10001)
    assert "10.1.0.21" not in _routes(leaf.ns, 10002)
    assert leaf.backend.drift(a) == []
    rules = json.loads(_ip(leaf.ns, "-j", "rule", "show"))
    assert any(r.get("priority") == 500 and r.get("table") == "77" for r in rules)
    # every VRF table ends in unreachable, so nothing falls through to the main table
    for vni in leaf.vnis:
        kinds = {(r.get("type"), r["dst"]) for r in json.loads(_ip(leaf.ns, "-j", "route", "show", "table",
                                                                    str(vni)))}
        assert ("unreachable", "default") in kinds


def test_a_batch_nftables_refuses_takes_its_new_routes_back(leaf1: tuple[Leaf, DeviceRuleSet,
                                                                          DeviceRuleSet]) -> None:
    leaf, a, b = leaf1
    leaf.backend.apply(a)
    before = leaf.backend.installed()
    with pytest.raises(ApplyError, match="nftables refused"):
        leaf.backend.apply(overlapping(b))  # b's leaked routes go in first, then the batch fails
    assert leaf.backend.installed() == before
    assert "10.2.0.21" not in _routes(leaf.ns, 10001)
    assert leaf.backend.drift(a) == []


def _nft(ns: str, command: str) -> str:
    def body() -> str:
        import nftables

        n = nftables.Nftables()
        rc, out, err = n.cmd(command)
        assert rc == 0, err
        return str(out)

    return run_in(ns, body)


def test_hand_edits_are_drift(leaf1: tuple[Leaf, DeviceRuleSet, DeviceRuleSet]) -> None:
    leaf, a, _ = leaf1
    leaf.backend.apply(a)
    assert leaf.backend.drift(a) == []
    _nft(leaf.ns, "add rule inet tf_leaf acl_acme accept")  # someone opens acme's ACL by hand
    assert any("unexpected: nft rule acl_acme" in d and "accept" in d for d in leaf.backend.drift(a))
    leaf.backend.apply(a)
    assert leaf.backend.drift(a) == []
    _nft(leaf.ns, "add element inet tf_leaf s0_v4 { 10.9.9.9 }")
    assert any("s0_v4" in d for d in leaf.backend.drift(a))
    leaf.backend.apply(a)
    _ip(leaf.ns, "rule", "del", "priority", "1000")
    assert [d for d in leaf.backend.drift(a) if "rule priority 1000" in d]
    _ip(leaf.ns, "route", "add", "10.2.0.21/32", "dev", "swp1.101", "table", "10001")  # a forged leak
    assert any("unexpected: ip -4 route 10.2.0.21/32 dev swp1.101 table 10001" in d for d in leaf.backend.drift(a))
    leaf.backend.apply(a)  # apply repairs all of it
    assert leaf.backend.drift(a) == []


def test_counters_read_back_per_rule_with_reasons(leaf1: tuple[Leaf, DeviceRuleSet, DeviceRuleSet]) -> None:
    leaf, a, _ = leaf1
    with pytest.raises(NotApplied):
        leaf.backend.counters(a)
    leaf.backend.apply(a)
    counters = leaf.backend.counters(a)
    acls = {r.scope for r in a.rules}
    assert {c.where for c in counters} == {f"acl_{t}" for t in acls}
    assert any(c.reasons == ("default-deny",) and c.action == "deny" for c in counters)
    assert any("grant:g-train-api" in c.reasons and c.action == "allow" for c in counters)
    assert all(c.packets == 0 for c in counters)  # nothing crossed this namespace: the counters are real


def test_a_missing_interface_refuses_before_touching_anything(leaf1: tuple[Leaf, DeviceRuleSet,
                                                                             DeviceRuleSet]) -> None:
    leaf, a, b = leaf1
    leaf.backend.apply(a)
    before = leaf.backend.installed()
    cut = LinuxBackend(leaf.ns, leaf.backend.fabric, LeafWiring(leaf.wiring.port_names, {}, {}, "169.254.0.1"))
    with pytest.raises(ApplyError, match="no path to leaf leaf2"):
        cut.apply(b)
    renamed = LinuxBackend(leaf.ns, leaf.backend.fabric,
                           LeafWiring({"swp1.101": "nosuchif"}, leaf.wiring.l3vni, leaf.wiring.vteps, "169.254.0.1"))
    with pytest.raises(ApplyError, match="nosuchif"):
        renamed.apply(b)
    assert leaf.backend.installed() == before


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(fabric=fabrics())
def test_what_is_applied_reads_back_as_rendered(fabric: Fabric) -> None:
    _need_root()
    compiled = compile_fabric(fabric, allowed_flows(fabric), revoked_ids(fabric))
    for rs in compiled.devices.values():
        if rs.kind != "leaf":
            continue
        leaf = Leaf(fabric, [p.name for p in rs.ports], [s.name for s in fabric.leaves if s.name != rs.name])
        try:
            leaf.backend.apply(rs)
            assert leaf.backend.drift(rs) == []
        finally:
            leaf.close()
