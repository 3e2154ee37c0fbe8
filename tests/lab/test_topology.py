"""The lab's plan (pure, no root): names fit Linux and stay unique, everything carries the lab's prefix,
every port a rule set names has an interface, and fabrics the lab cannot realise are refused clearly."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from enforcer.fabric import Fabric, Grant, Link, Node, Placement, Switch
from lab.errors import LabInputError
from lab.topology import IFNAMSIZ, Names, lab_id, plan, topology_digest
from tests.enforcer.helpers import compile_small, small


def _ifnames_by_ns(p: object) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in p.veths:  # type: ignore[attr-defined]
        out.setdefault(v.ns_a, []).append(v.if_a)
        out.setdefault(v.ns_b, []).append(v.if_b)
    return out


def test_names_fit_linux_are_unique_and_carry_the_prefix() -> None:
    names = Names(lab_id(Path("/tmp/some-home")))
    p = plan(small(), names)
    assert all(ns.startswith(names.prefix) for ns in p.namespaces)
    assert len(set(p.namespaces)) == len(p.namespaces) == 1 + 4 + 2 + 1  # ovs, nodes, leaves, spine
    for ns, ifs in _ifnames_by_ns(p).items():
        assert ns in p.namespaces
        assert all(0 < len(i) <= IFNAMSIZ for i in ifs)
        assert not [i for i, n in Counter(ifs).items() if n > 1], ns
    # the lab's leaves use the enforcer's attachment names; the nodes the NIC host port names
    assert p.leaves["leaf:leaf1"][1].port_names == {"swp1.101": "swp1.101", "swp1.102": "swp1.102",
                                                   "swp2.101": "swp2.101"}
    assert p.workloads["acme/train/w1"].ifname == "pf0vf0"


def test_every_port_a_rule_set_names_has_an_interface() -> None:
    compiled, _ = compile_small()
    p = plan(compiled.fabric, Names("tfl000000"))
    for device, rs in compiled.devices.items():
        if rs.kind == "nic":
            assert set(p.nics[device].port_names) == {rs.uplink, *(x.name for x in rs.ports)}
        else:
            ns, wiring = p.leaves[device]
            assert set(wiring.port_names) == {x.name for x in rs.ports}
            assert wiring.l3vni and wiring.vteps  # two leaves: each VRF rides its L3VNI to the other
            assert set(wiring.port_names.values()) <= set(_ifnames_by_ns(p)[ns])


def test_the_lab_id_follows_the_data_directory() -> None:
    a, b = lab_id(Path("/tmp/a")), lab_id(Path("/tmp/b"))
    assert a == lab_id(Path("/tmp/../tmp/a")) and a != b
    assert a.startswith("tfl") and len(a) == 9
    assert Names(a).rundir.name == f"{a}-ovs"


def test_names_too_long_for_linux_fall_back_to_short_ones() -> None:
    f = small()
    long_leaf = "swp-to-gpu-number-1"
    nodes = tuple(dataclasses.replace(n, host_ports=("pf0-virtual-function-0", *n.host_ports)) for n in f.nodes)
    switches = tuple(dataclasses.replace(s, ports=(*s.ports, long_leaf)) if s.name == "leaf1" else s
                     for s in f.switches)
    links = tuple(dataclasses.replace(lk, leaf_port=long_leaf) if (lk.leaf, lk.leaf_port) == ("leaf1", "swp1") else lk
                  for lk in f.links)
    placements = tuple(dataclasses.replace(pl, port="pf0-virtual-function-0") if pl.workload == "acme/train/w1"
                       else pl for pl in f.placements)
    fabric = dataclasses.replace(f, nodes=nodes, switches=switches, links=links, placements=placements)
    p = plan(fabric, Names("tfl000000"))
    assert p.workloads["acme/train/w1"].ifname == "vf0"
    assert p.leaves["leaf:leaf1"][1].port_names[f"{long_leaf}.101"] == "a0v101"
    for ifs in _ifnames_by_ns(p).values():
        assert all(len(i) <= IFNAMSIZ for i in ifs) and len(set(ifs)) == len(ifs)


def _two_leaves(spine_links: tuple[Link, ...]) -> Fabric:
    f = small()
    spines = tuple(Switch(s, "spine", ("swp1", "swp2")) for s in sorted({lk.peer for lk in spine_links}))
    return dataclasses.replace(f, switches=(*f.leaves, *spines),
                               links=(*(lk for lk in f.links if lk.peer_kind == "node"), *spine_links))


def test_leaves_without_a_shared_spine_are_refused() -> None:
    with pytest.raises(LabInputError, match="no spine links"):
        plan(_two_leaves(()), Names("tfl000000"))
    apart = (Link("leaf1", "swp31", "spine1", "swp1", "spine"), Link("leaf2", "swp31", "spine2", "swp1", "spine"))
    with pytest.raises(LabInputError, match="share no spine"):
        plan(_two_leaves(apart), Names("tfl000000"))


def test_the_topology_digest_ignores_policy_and_sees_placements() -> None:
    f = small()
    later = Grant("g-new", "globex", "batch", "acme", "data", "tcp", (5432,), datetime(2099, 1, 1, tzinfo=UTC))
    assert topology_digest(dataclasses.replace(f, grants=(*f.grants, later))) == topology_digest(f)
    moved = tuple(Placement(p.workload, "gpu2", "pf0vf2", p.ipv4, p.ipv6) if p.workload == "acme/train/w1" else p
                  for p in f.placements)
    assert topology_digest(dataclasses.replace(f, placements=moved)) != topology_digest(f)
    assert topology_digest(dataclasses.replace(f, nodes=(*f.nodes, Node("gpu9", ("p0",), ())))) != topology_digest(f)


def test_the_generated_fabric_loads_and_plans() -> None:
    from enforcer.fabric_file import load_fabric
    from lab.generate import fabric_yaml

    fabric = load_fabric(fabric_yaml(50), source="gen50.yaml")
    assert (len(fabric.nodes), len(fabric.leaves), len(fabric.spines), len(fabric.placements)) == (50, 4, 2, 101)
    p = plan(fabric, Names("tfl000000"))
    assert len(p.namespaces) == 1 + 50 + 4 + 2
    for ifs in _ifnames_by_ns(p).values():
        assert len(set(ifs)) == len(ifs)
    with pytest.raises(ValueError):
        fabric_yaml(0)
