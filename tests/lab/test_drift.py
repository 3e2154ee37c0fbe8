"""Drift in a standalone lab: a device changed by hand (an OVS flow deleted with ovs-ofctl, a leaf's
nftables rule deleted with nft) is found by `lab apply` and its applied rule set installed again, though the
fabric file did not change; the report names each repaired device with its differences."""

from __future__ import annotations

import subprocess
from pathlib import Path

from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from lab import build, operations, standalone, state
from lab.probe import probe
from tests.enforcer.helpers import SMALL
from tests.lab.conftest import LAB, OPEN, require_lab

pytestmark = LAB


def _nft(netns: str, *args: str) -> str:
    return run_in(netns, lambda: subprocess.run(["nft", *args], capture_output=True, text=True, check=True).stdout)


class _Lab:
    """The lab's state and fabric, read again after each apply."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.reload()

    def reload(self) -> None:
        loaded = state.load(self.home)
        assert loaded is not None
        self.st = loaded
        self.fabric = standalone.compile_file(Path(loaded["file"]))[0]


def test_lab_apply_repairs_a_flow_and_a_rule_changed_by_hand(tmp_path: Path) -> None:
    require_lab()
    home, file = tmp_path / "home", tmp_path / "fabric.yaml"
    file.write_text(SMALL.read_text())
    try:
        operations.up(home, file)
        lab = _Lab(home)
        nic, leaf = lab.st["devices"]["nic:gpu1"], lab.st["devices"]["leaf:leaf1"]
        # the grant's allow flow on gpu1's SuperNIC, deleted by hand: the wire blocks what the policy allows
        daemons = OvsDaemons(Path(nic["ovs_rundir"]))
        daemons.run("ovs-ofctl", "-O", "OpenFlow13", "del-flows", daemons.mgmt(nic["bridge"]),
                    "table=1,tcp,nw_dst=10.2.0.11,tp_dst=8443")
        assert not probe(lab.st, standalone.installed(lab.st, lab.fabric), "acme/train/w1", "globex/api/a1",
                         8443, 4, 0.5).open
        # and a rule of leaf1's table, flushed by hand
        chains = [line.split()[1] for line in _nft(leaf["netns"], "list", "table", "inet", "tf_leaf").splitlines()
                  if line.strip().startswith("chain ")]
        _nft(leaf["netns"], "flush", "chain", "inet", "tf_leaf", chains[0])

        report = operations.apply(lab.home)
        lab.reload()
        assert probe(lab.st, standalone.installed(lab.st, lab.fabric), "acme/train/w1", "globex/api/a1",
                     8443, 4, OPEN).open
        assert report["applied"] == ["leaf:leaf1", "nic:gpu1"]
        assert set(report["repaired"]) == {"nic:gpu1", "leaf:leaf1"} and all(report["repaired"].values())
        assert standalone.drifted(lab.st, lab.fabric, sorted(lab.st["devices"])) == {}
        assert operations.apply(lab.home)["applied"] == []  # nothing drifted, nothing changed: nothing applied
    finally:
        build.teardown(home)
