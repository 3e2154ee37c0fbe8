"""The lab's commands when no lab is up: `lab down` needs root and iproute2 only (it ends processes and deletes
namespaces: no Open vSwitch), and `lab apply`/`lab probe` say that no lab is up before naming a tool they would
need. On a machine without Open vSwitch, `lab down` failed with "ovsdb-server not found" and probe/apply said so
instead of "no lab is up". Nothing here creates a namespace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab import build, operations
from lab.errors import LabError


@pytest.fixture
def no_ovs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "ovs_available", lambda: "ovsdb-server not found (Debian package openvswitch-switch)")


def test_without_a_lab_down_needs_no_open_vswitch(no_ovs: None, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("lab down needs root")
    report = operations.down(tmp_path)
    assert report["lab"] == build.names_for(tmp_path).lab and report["namespaces"] == [] and report["processes"] == 0


@pytest.mark.parametrize("command", ["apply", "probe"])
def test_without_a_lab_apply_and_probe_say_so_first(no_ovs: None, tmp_path: Path, command: str) -> None:
    with pytest.raises(LabError, match="no lab is up"):
        if command == "apply":
            operations.apply(tmp_path)
        else:
            operations.probe(tmp_path, "acme/train/w1", "globex/api/a1", 8443)
