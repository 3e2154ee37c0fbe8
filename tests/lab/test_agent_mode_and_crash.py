"""Agent mode and crash cleanup, on a lab of their own: `lab up --mode agent` builds the topology only, and
the state file alone is enough to attach the enforcer's backends to each device id (what a node agent
does); after a simulated crash (OVS daemons killed, state file deleted) `lab down` still removes every
namespace, interface, daemon and the run directory. The namespace the lab is driven from is untouched: the
cycle runs from a namespace of the test's own that plays the root namespace (other tests on this machine
change the real root's links, so only there can "exactly unchanged" be asserted), whose links and nftables
ruleset are the same after the whole cycle; and no lab interface ever appears in the real root either."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from lab import build, netops, operations, standalone, state
from lab.errors import LabError
from lab.probe import connect, endpoint, listening
from tests.enforcer.helpers import SMALL
from tests.lab.conftest import LAB, OPEN, require_lab

pytestmark = LAB


def _links(netns: str | None = None) -> set[str]:
    where = ["-n", netns] if netns else []
    return {x["ifname"] for x in json.loads(subprocess.run(["ip", *where, "-j", "link", "show"], capture_output=True,
                                                           text=True, check=True).stdout)}


def _ruleset() -> str:
    import nftables

    n = nftables.Nftables()
    n.set_stateless_output(True)
    rc, out, err = n.cmd("list ruleset")
    assert rc == 0, err
    return str(out)


@pytest.fixture
def caller_ns() -> Iterator[str]:
    """The namespace the lab is driven from (it plays the root namespace)."""
    name = f"tfr{os.getpid() % 10000}{secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _lab_ifnames(st: dict[str, Any]) -> set[str]:
    names = {w["ifname"] for w in st["workloads"].values()}
    for d in st["devices"].values():
        if d["kind"] == "nic":
            names |= {d["bridge"], *d["port_names"].values()}
        else:
            names |= {*d["wiring"]["port_names"].values(), *d["wiring"]["l3vni"].values()}
    return names


def _processes_naming(text: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _attach_like_an_agent(st: dict[str, Any], device: str, fabric: Any) -> Any:
    d = st["devices"][device]
    if d["kind"] == "nic":
        return OvsBackend(OvsDaemons(Path(d["ovs_rundir"])), d["bridge"], d["port_names"])
    return LinuxBackend(d["netns"], fabric, LeafWiring.from_dict(d["wiring"]))


def test_agent_mode_then_a_crash_then_down(tmp_path: Path, caller_ns: str) -> None:
    require_lab()
    home = tmp_path / "home"
    links, ruleset = _links(caller_ns), run_in(caller_ns, _ruleset)
    try:
        report = run_in(caller_ns, operations.up, home, SMALL, "agent")
        assert report["applied"] == []
        st = state.load(home)
        assert st is not None and st["mode"] == "agent"
        assert not (_lab_ifnames(st) & (_links() | _links(caller_ns)))  # every lab interface is in a lab namespace
        if shutil.which("ethtool"):  # both ends of a veth into OVS: TX checksum offload off (see DESIGN.md)
            for ns, ifname in ((st["workloads"]["acme/train/w1"]["netns"], "pf0vf0"), (st["ovs"]["netns"], "n0p0"),
                               (st["devices"]["leaf:leaf1"]["netns"], "swp1.101")):
                shown = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", ifname], capture_output=True,
                                       text=True, check=True).stdout
                assert "tx-checksumming: off" in shown, (ns, ifname)
        w1, a1 = endpoint(st, "acme/train/w1"), endpoint(st, "globex/api/a1")
        with listening([(a1, 4, 8443)]):
            assert not connect(w1, a1, 8443, timeout=0.5)[0]  # no rule set yet: the NICs drop everything
            fabric, compiled, _ = standalone.compile_file(SMALL)
            for device, rs in compiled.devices.items():
                run_in(caller_ns, _attach_like_an_agent(st, device, fabric).apply, rs)
            assert connect(w1, a1, 8443, timeout=OPEN)[0]  # the grant, applied through the state file's device map
            assert not connect(w1, a1, 9999, timeout=0.5)[0]
        seen = operations.probe(home, "acme/train/w1", "globex/api/a1", 8443, timeout=OPEN)
        assert seen.open and seen.enforcer_allows is None  # the lab holds no rule sets: the wire's answer only
        # and no counters were read: the probe names no rule (it named "conntrack-return" for an open path)
        assert seen.decided_by == ["counters not read: no rule sets recorded for this path (agent mode: the node "
                                   "agents hold them)"]
        shut = operations.probe(home, "acme/train/w1", "globex/api/a1", 9999, timeout=0.5)
        assert not shut.open and shut.decided_by == seen.decided_by  # not "no deny rule counted the packets"
        with pytest.raises(LabError, match="agent-driven"):
            operations.apply(home)

        # the crash: the OVS daemons die, the state file is lost
        rundir = Path(st["ovs"]["rundir"])
        pids = [int((rundir / f).read_text()) for f in ("ovsdb.pid", "vswitchd.pid")]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        state.remove(home)
        assert operations.status(home)["status"] == "leftovers"
    finally:
        gone = run_in(caller_ns, operations.down, home)
    assert len(gone["namespaces"]) == 8 and gone["rundir"] == str(rundir)
    prefix = build.names_for(home).prefix
    assert netops.namespaces_with_prefix(prefix) == []
    assert not rundir.exists() and not state.state_path(home).exists()
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # killed processes are reaped by init
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert _processes_naming(str(rundir)) == []
    assert _links(caller_ns) == links == {"lo"} and run_in(caller_ns, _ruleset) == ruleset
    assert not (_lab_ifnames(st) & _links())
    assert operations.status(home)["status"] == "down"
    assert operations.down(home)["namespaces"] == []  # down again: nothing to do, no error
