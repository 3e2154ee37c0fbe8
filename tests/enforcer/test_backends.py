"""One conformance test for every Backend: OVS (a real ovs-vswitchd in its own run directory), NVUE (the
REST stand-in) and Linux (nftables + policy routing in a network namespace the test creates)."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from enforcer.backends.base import Backend
from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.backends.nvue import NvueBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.compiler import recompile
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import AddressSet, DeviceRuleSet
from enforcer.ovsd import OvsDaemons
from tests.enforcer.helpers import compile_small
from tests.enforcer.nvue_standin import NvueStandIn


@dataclass
class Target:
    backend: Backend
    a: DeviceRuleSet  # a good rule set
    b: DeviceRuleSet  # another good rule set for the same device
    broken: DeviceRuleSet  # one the device refuses


def _sets(device: str) -> tuple[DeviceRuleSet, DeviceRuleSet]:
    compiled, allowed = compile_small()
    extra = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [5432], "reason": "grant:new",
             "sources": ["globex/batch"]}
    changed = recompile(compiled, [*allowed, extra])
    a, b = compiled.devices[device], changed.devices[device]
    assert a.canonical != b.canonical
    return a, b


@contextmanager
def _ovs(request: pytest.FixtureRequest) -> Iterator[Target]:
    daemons: OvsDaemons = request.getfixturevalue("ovs_daemons")
    tok = secrets.token_hex(3)
    bridge = f"tfb{tok}"
    daemons.add_bridge(bridge)
    try:
        a, b = _sets("nic:gpu1")
        names = {a.uplink: f"tf{tok}u"} | {p.name: f"tf{tok}{i}" for i, p in enumerate(a.ports)}
        for n in names.values():
            daemons.add_port(bridge, n, internal=True)
        ghost = dataclasses.replace(b, ports=(*b.ports, b.ports[0]._replace(name="ghost9",
                                                                             v4=("10.1.0.99/32",), v6=())))
        yield Target(OvsBackend(daemons, bridge, names), a, b, ghost)
    finally:
        daemons.del_bridge(bridge)


@contextmanager
def _nvue(request: pytest.FixtureRequest) -> Iterator[Target]:
    with NvueStandIn(ports=("swp1", "swp2", "swp31")) as standin:
        a, b = _sets("leaf:leaf1")
        broken = dataclasses.replace(b, ports=(*b.ports, b.ports[0]._replace(name="swp9.101",
                                                                              base="swp9")))
        yield Target(NvueBackend(standin.url), a, b, broken)


def overlapping(rs: DeviceRuleSet) -> DeviceRuleSet:
    """`rs` with one address set holding overlapping intervals: nftables refuses the whole batch."""
    i, s = next((i, s) for i, s in enumerate(rs.sets) if s.v4)
    bad = AddressSet(s.name, ("10.1.0.0/16", "10.1.0.11/32"), s.v6)
    return dataclasses.replace(rs, sets=(*rs.sets[:i], bad, *rs.sets[i + 1:]))


@contextmanager
def _linux(request: pytest.FixtureRequest) -> Iterator[Target]:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, nftables and iproute2 to create a network namespace")
    ns = f"tfc{secrets.token_hex(3)}{os.getpid() % 1000}"
    a, b = _sets("leaf:leaf1")
    compiled, _ = compile_small()
    vnis = sorted(t.vni for t in compiled.fabric.tenants)
    lines = ["link set lo up", "addr add 100.127.0.1/32 dev lo"]
    lines += [f"link add {p.name} type veth peer name y{i}" for i, p in enumerate(a.ports)]
    lines += [f"link set {p.name} up" for p in a.ports]
    for vni in vnis:
        lines += [f"link add vx{vni} type vxlan id {vni} local 100.127.0.1 dstport 4789 nolearning",
                  f"link set vx{vni} up"]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True,
                       capture_output=True)
        wiring = LeafWiring(l3vni={v: f"vx{v}" for v in vnis}, vteps={"leaf2": "100.127.0.2"},
                            gateway_v4="169.254.0.1")
        yield Target(LinuxBackend(ns, compiled.fabric, wiring), a, b, overlapping(b))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


TARGETS: dict[str, Callable[[pytest.FixtureRequest], object]] = {"ovs": _ovs, "nvue": _nvue, "linux": _linux}


@pytest.fixture(params=sorted(TARGETS))
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with TARGETS[request.param](request) as t:  # type: ignore[attr-defined]
        yield t


def test_render_is_pure(target: Target) -> None:
    assert target.backend.render(target.a) == target.backend.render(dataclasses.replace(target.a))
    assert target.backend.render(target.a) != target.backend.render(target.b)


def test_nothing_installed_reads_as_not_applied(target: Target) -> None:
    with pytest.raises(NotApplied):
        target.backend.installed()


def test_apply_installs_exactly_the_set_and_reads_it_back(target: Target) -> None:
    be = target.backend
    assert be.apply(target.a) == target.a.content_hash
    assert be.drift(target.a) == []
    first = be.installed()
    assert be.drift(target.b) != []
    assert be.apply(target.b) == target.b.content_hash
    assert be.drift(target.b) == []
    assert be.installed() != first
    assert be.apply(target.a) and be.installed() == first  # back again: same state as before


def test_a_refused_set_leaves_the_last_good_one_in_force(target: Target) -> None:
    be = target.backend
    be.apply(target.b)
    before = be.installed()
    with pytest.raises(ApplyError):
        be.apply(target.broken)
    assert be.installed() == before
    assert be.drift(target.b) == []
