"""`lab up` / `lab down` / `lab status`: build the plan of lab.topology on this machine and take it away.

up: one `ip -batch` in the root namespace creates every namespace and every veth (each end directly inside
its namespace, so no lab interface ever sits in the root namespace); then, one thread per namespace and
in parallel, the sysctls and checksum offloads (in-thread, no process) and one `ip -batch` per family;
then one private OVS (ovsdb-server + ovs-vswitchd started inside the lab's OVS namespace, run directory
of its own) and a single ovs-vsctl transaction for every bridge and port; then br-wire's flows. The state
file is written before anything is created, so a crash at any point leaves a lab `lab down` removes.

down: every namespace whose name starts with the lab's prefix (found in /run/netns, with or without a
state file), every process inside them (the OVS daemons; ended by pid), the OVS daemons named by the
run directory's pid files (only if their command line names that directory), the run directory and the
state file. Nothing outside the prefix is looked at.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from enforcer.fabric import Fabric
from enforcer.netns import exists, run_in
from enforcer.ovsd import OvsDaemons, ovs_available
from lab import netops, state
from lab.errors import LabError
from lab.topology import WIRE_BRIDGE, Names, Plan, lab_id, plan, topology_digest

TOOLS = ("ip", "bridge")


@dataclass
class Timings:
    steps: dict[str, float] = field(default_factory=dict)
    _t: float = field(default_factory=time.perf_counter)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.steps[name] = round(now - self._t, 4)
        self._t = now

    @property
    def total(self) -> float:
        return round(sum(self.steps.values()), 4)


def require_root(*, ovs: bool = True) -> None:
    """LabError saying what is missing when the lab cannot run on this machine (`ovs=False`: for taking one down,
    which ends processes and deletes namespaces, root and iproute2 are enough)."""
    if os.geteuid() != 0:
        raise LabError("the lab creates network namespaces and needs root")
    for tool in TOOLS:
        if shutil.which(tool) is None:
            raise LabError(f"{tool} is not installed (Debian package iproute2)")
    if not ovs:
        return
    reason = ovs_available()
    if reason:
        raise LabError(reason)


def names_for(home: Path) -> Names:
    return Names(lab_id(home))


def build(home: Path, fabric: Fabric, source: str, mode: str, timings: Timings) -> dict[str, Any]:
    """Create the lab for `fabric` and return its state (saved); any failure removes what was made."""
    names = names_for(home)
    if state.load(home) is not None or netops.namespaces_with_prefix(names.prefix):
        raise LabError(f"a lab ({names.lab}) is already up for {home}: `trustfabric lab down` first")
    p = plan(fabric, names)
    timings.lap("plan")
    st: dict[str, Any] = {"lab": names.lab, "status": "building", "mode": mode, "file": source,
                          "created_at": datetime.now(UTC).isoformat(), "namespaces": p.namespaces,
                          "ovs": {"rundir": str(names.rundir), "netns": names.ovs_ns, "wire_bridge": WIRE_BRIDGE},
                          "topology": topology_digest(fabric)}
    state.save(home, st)
    try:
        _create(p, timings)
    except BaseException:
        teardown(home)
        raise
    st.update(status="up", devices=_devices(p), workloads={
        k: {"node": w.node, "netns": w.netns, "ifname": w.ifname, "ipv4": w.ipv4, "ipv6": w.ipv6}
        for k, w in sorted(p.workloads.items())})
    state.save(home, st)
    return st


def _create(p: Plan, timings: Timings) -> None:
    root = [f"netns add {ns}" for ns in p.namespaces]
    root += [f"link add {v.if_a} netns {v.ns_a} type veth peer name {v.if_b} netns {v.ns_b}" for v in p.veths]
    netops.ip_batch(root)
    timings.lap("namespaces+veths")

    def configure(ns: str) -> None:
        sysctls, tx_off = p.sysctls.get(ns, []), p.tx_off.get(ns, [])

        def inside() -> None:
            netops.write_sysctls(sysctls)
            netops.tx_checksum_off(tx_off)

        run_in(ns, inside)
        netops.ip_batch(p.ip_lines.get((ns, 4), []), ns)
        netops.ip_batch(p.ip_lines.get((ns, 6), []), ns, family6=True)
        netops.bridge_batch(p.fdb_lines.get(ns, []), ns)

    netops.parallel([partial(configure, ns) for ns in p.namespaces])
    timings.lap("addresses+routes")
    daemons = OvsDaemons(p.names.rundir, netns=p.names.ovs_ns).start()
    timings.lap("ovs daemons")
    args: list[str] = []
    bridges = [(WIRE_BRIDGE, p.wire_ports)] + [(n.bridge, n.ports) for n in p.nics.values()]
    for bridge, ports in bridges:
        args += ["--", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
                 "protocols=OpenFlow13", "fail_mode=secure"]
        for port, kind in ports:
            args += ["--", "add-port", bridge, port]
            if kind.startswith("patch:"):
                args += ["--", "set", "interface", port, "type=patch", f"options:peer={kind[6:]}"]
    # counters a probe reads must be current: revalidate the datapath's flow cache every 100 ms, not 500
    args += ["--", "set", "Open_vSwitch", ".", "other_config:max-revalidator=100"]
    daemons.vsctl(*args[1:])
    timings.lap("ovs bridges")
    if p.wire_flows:
        daemons.run("ovs-ofctl", "-O", "OpenFlow13", "add-flows", daemons.mgmt(WIRE_BRIDGE), "-",
                    input="".join(f + "\n" for f in p.wire_flows))
    timings.lap("wire flows")


def _devices(p: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dev, nic in sorted(p.nics.items()):
        out[dev] = {"kind": "nic", "ovs_rundir": str(p.names.rundir), "ovs_netns": p.names.ovs_ns,
                    "bridge": nic.bridge, "port_names": dict(sorted(nic.port_names.items()))}
    for dev, (ns, wiring) in sorted(p.leaves.items()):
        out[dev] = {"kind": "leaf", "netns": ns, "wiring": wiring.to_dict()}
    return out


def teardown(home: Path) -> dict[str, Any]:
    """Remove the lab of `home`, whatever state it is in; what was removed."""
    names = names_for(home)
    try:
        st = state.load(home)
    except LabError:
        st = None
    rundir = Path(st["ovs"]["rundir"]) if st else names.rundir
    namespaces = netops.namespaces_with_prefix(names.prefix)
    pids = {pid for ns in namespaces for pid in netops.pids_in_netns(ns)} | _daemon_pids(rundir)
    netops.end_processes(pids, grace=0)  # their namespaces and run directory go next: nothing to save
    if namespaces:
        netops.ip_batch(f"netns del {ns}" for ns in namespaces)
    had_rundir = rundir.exists()
    shutil.rmtree(rundir, ignore_errors=True)
    state.remove(home)
    return {"lab": names.lab, "namespaces": namespaces, "processes": len(pids),
            "rundir": str(rundir) if had_rundir else None}


def _daemon_pids(rundir: Path) -> set[int]:
    """The OVS daemons of this run directory (a pid file whose process still names the directory)."""
    out = set()
    for pidfile in rundir.glob("*.pid") if rundir.is_dir() else ():
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if str(rundir) in cmdline:
            out.add(pid)
    return out


def status(home: Path) -> dict[str, Any]:
    """The state file, with what is really there: namespaces present, OVS daemons alive."""
    names = names_for(home)
    st = state.load(home)
    present = netops.namespaces_with_prefix(names.prefix)
    if st is None:
        return {"lab": names.lab, "status": "down" if not present else "leftovers", "namespaces": present}
    rundir = Path(st["ovs"]["rundir"])
    out = {k: v for k, v in st.items() if k != "applied"}
    out["applied"] = {d: a["hash"] for d, a in sorted(st.get("applied", {}).items())}
    out["missing_namespaces"] = [ns for ns in st["namespaces"] if not exists(ns)]
    out["ovs_daemons_alive"] = len(_daemon_pids(rundir))
    return out
