"""One conformance test for every Backend: OVS (a real ovs-vswitchd in its own run directory) and NVUE (the
REST stand-in). The lab's Linux backend joins by adding a factory to TARGETS."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from enforcer.backends.base import Backend
from enforcer.backends.nvue import NvueBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.compiler import recompile
from enforcer.errors import ApplyError, NotApplied
from enforcer.ir import DeviceRuleSet
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


TARGETS: dict[str, Callable[[pytest.FixtureRequest], object]] = {"ovs": _ovs, "nvue": _nvue}


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
