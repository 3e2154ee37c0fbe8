"""The fabric file parser: the golden example loads, and every kind of mistake names its line and field."""

from __future__ import annotations

import re

import pytest

from enforcer.allocate import Pools
from enforcer.errors import FabricError
from enforcer.fabric import Workload, policy_data
from enforcer.fabric_file import load_fabric
from tests.enforcer.helpers import SMALL, small

BASE = SMALL.read_text()


def test_golden_example_loads_with_its_topology() -> None:
    f = small()
    assert [t.slug for t in f.tenants] == ["acme", "globex", "platform"]
    assert {n.name: f.attachment[n.name].leaf for n in f.nodes} == {
        "gpu1": "leaf1", "gpu2": "leaf1", "gpu3": "leaf2", "gpu4": "leaf2"}
    assert [s.name for s in f.spines] == ["spine1"]
    assert f.placement["acme/train/w1"].ipv6 == "fd00:1::11"
    assert f.grants[0].id == "g-train-api" and f.grants[0].expires_at.year == 2099
    data = policy_data(f)["tf"]
    assert data["tenants"]["platform"]["groups"]["dns"]["exposed"] == {"tcp": [53], "udp": [53]}
    assert data["grants"]["acme"]["globex"]["g-train-api"]["ports"] == [8443]


def _edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


@pytest.mark.parametrize(("old", "new", "needle", "message"), [
    ("acme/train/w1: {node: gpu1,", "acme/train/w1: {node: gpu9,", "acme/train/w1: {node: gpu9",
     "placements.acme/train/w1.node: unknown node 'gpu9'"),
    ("ipv4: 10.1.0.12}", "ipv4: 10.9.0.12}", "acme/train/w2: {node", "10.9.0.12 is outside tenant acme's prefixes"),
    ("ipv4: 10.1.0.21,", "ipv4: 10.1.0.11,", "acme/data/db1: {node", "duplicate address 10.1.0.11"),
    ("  globex/batch/b1: {node: gpu1", "  globex/batch/b9: {node: gpu1", "globex/batch/b9",
     "unknown workload 'globex/batch/b9'"),
    ("port: pf0vf1, ipv4: 10.2.0.21", "port: pf0vf7, ipv4: 10.2.0.21", "globex/batch/b1: {node",
     "node gpu1 has no host port 'pf0vf7'"),
    ("port: pf0vf1, ipv4: 10.2.0.11", "port: pf0vf0, ipv4: 10.2.0.11", "globex/api/a1: {node",
     "gpu3:pf0vf0 already carries acme/train/w2"),
    ("  - [leaf2:swp2, gpu4:p0]", "  - [leaf2:swp9, gpu4:p0]", "[leaf2:swp9", "leaf leaf2 has no port 'swp9'"),
    ("  - [leaf2:swp2, gpu4:p0]", "  - [leaf2:swp1, gpu4:p0]", "[leaf2:swp1, gpu4", "leaf2:swp1 is already cabled"),
    ("globex/api: {ports: [tcp/8443]}", "globex/api: {ports: [tcp/99999]}", "globex/api: {ports",
     "'tcp/99999' must be <tcp|udp>/<1-65535>"),
    ("globex/api: {ports: [tcp/8443]}", "globex/api: {ports: [tcp/8\u00b2]}", "globex/api: {ports",
     "'tcp/8\u00b2' must be <tcp|udp>/<1-65535>"),  # str.isdigit takes the superscript two, int() does not
    ("globex/api: {ports: [tcp/8443]}", "globex/api: {ports: [tcp/8443], colour: blue}", "globex/api: {ports",
     "globex/api.colour: unknown field"),
    ("  acme/data/db1:\n", "  acme/data/db1:\n  acme/data/db1:\n", "  acme/data/db1:\n  acme/data/db1:",
     "duplicate key"),
    ("src: acme/train, dst: globex/api", "src: acme/train, dst: globex/nope", "g-train-api",
     "unknown group 'globex/nope'"),
    ("expires_at: 2099-01-01T00:00:00Z", "expires_at: 2099-01-01", "g-train-api", "time zone"),
    ("globex: {vni: 10002,", "globex: {vni: 10001,", "tenants:", "both use VNI 10001"),
    ("prefixes: [10.2.0.0/16]", "prefixes: [10.1.128.0/17]", "tenants:", "overlaps"),
])
def test_bad_input_names_the_line_and_field(old: str, new: str, needle: str, message: str) -> None:
    text = _edit(old, new)
    with pytest.raises(FabricError) as info:
        load_fabric(text, source="fab.yaml")
    msg = str(info.value)
    assert message in msg
    line = int(re.match(r"fab\.yaml:(\d+): ", msg).group(1))  # type: ignore[union-attr]
    assert line == _line_of(text, needle) + needle.count("\n")


def test_not_yaml_and_missing_trust_domain() -> None:
    with pytest.raises(FabricError, match=r"x\.yaml:2: not valid YAML"):
        load_fabric("a: [1\nb: ]", source="x.yaml")
    with pytest.raises(FabricError, match="trust_domain: is required"):
        load_fabric("tenants: {}\n")
    # a scalar YAML resolves to a tag it has no constructor for (schemathesis sent `=`): a FabricError, not a 500
    with pytest.raises(FabricError, match=r"x\.yaml:1: \(top\): not a value this file can hold"):
        load_fabric("=", source="x.yaml")


def test_missing_vni_vlan_and_prefix_are_allocated_from_pools_without_clashes() -> None:
    text = ("trust_domain: t.org\ntenants:\n  a: {vni: 10000, prefixes: [10.0.0.0/20]}\n  b: {}\n  c: {vlan: 100}\n")
    f = load_fabric(text, pools=Pools(ipv6="fd00::/32"))
    t = f.tenant
    assert t["a"].vni == 10000 and t["b"].vni == 10001 and t["c"].vni == 10002
    assert t["c"].vlan == 100 and {t["a"].vlan, t["b"].vlan} == {101, 102}
    assert t["b"].prefixes == ("10.0.16.0/20", "fd00::/48")  # 10.0.0.0/20 is a's
    again = load_fabric(text, pools=Pools(ipv6="fd00::/32"))
    assert again.tenants == f.tenants


def test_workloads_may_come_from_the_caller() -> None:
    text = BASE.split("workloads:")[0] + "nodes:" + BASE.split("nodes:", 1)[1]
    with pytest.raises(FabricError, match="unknown workload 'acme/train/w1'"):
        load_fabric(text)

    def workload(key: str) -> Workload:
        tenant, group, name = key.split("/")
        return Workload(tenant, group, name)

    known = [workload(w) for w in ("acme/train/w1", "acme/train/w2", "acme/data/db1", "globex/api/a1",
                                   "globex/batch/b1", "platform/dns/ns1")]
    assert len(load_fabric(text, known_workloads=known).placements) == 6


def _alias_bomb(levels: int) -> str:
    lines = ["trust_domain: example.org", "x0: &a0 [" + ",".join(["p"] * 9) + "]"]
    lines += [f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [7, 12])
def test_a_yaml_alias_bomb_is_refused_before_it_expands(levels: int) -> None:
    """POST /v1/fabric/import takes the file's text: YAML aliases share a node, which the loader expanded at every
    reference, so 700 bytes of nested aliases were 9**12 values (the server's worker busy for hours, its memory gone).
    A file that expands beyond two values per byte of its text is refused, naming where."""
    with pytest.raises(FabricError, match=r"x\.yaml:\d+: x\d+(\.\d+)*: .*YAML aliases"):
        load_fabric(_alias_bomb(levels), "x.yaml")


def test_a_few_yaml_aliases_still_load() -> None:
    """An alias as a person writes one (the same host ports on every node) loads as if written out."""
    nodes = ("nodes:\n  gpu1: {nic: {uplinks: [p0], host_ports: &hp [pf0vf0, pf0vf1]}}\n"
             "  gpu2: {nic: {uplinks: [p0], host_ports: *hp}}\n")
    fabric = load_fabric(f"trust_domain: example.org\n{nodes}", "x.yaml")
    assert [n.name for n in fabric.nodes] == ["gpu1", "gpu2"]


def test_one_nic_anchored_for_many_nodes_loads() -> None:
    """An anchor is what YAML offers for 64 identical nodes: their 128-VF NIC written once (2.6 KB of text, 8,500
    values). The bound of two values per byte of text refused it ('aliases expand it beyond...'); a small file may now
    expand as far as a modest alias-free one holds (core/yaml_bound.py), and a bomb is still refused."""
    ports = ", ".join(f"pf0vf{i}" for i in range(128))
    nodes = [f"  gpu1: {{nic: &bf3 {{uplinks: [p0], host_ports: [{ports}]}}}}"]
    nodes += [f"  gpu{i}: {{nic: *bf3}}" for i in range(2, 65)]
    fabric = load_fabric("trust_domain: example.org\nnodes:\n" + "\n".join(nodes) + "\n", "x.yaml")
    assert len(fabric.nodes) == 64 and all(len(n.host_ports) == 128 for n in fabric.nodes)
