"""Tenant separation holds in depth on the golden lab: the SuperNIC drops a spoofed source, and with every
NIC rule replaced by a plain tag-and-forward and every leaf ACL removed, the leaf VRFs alone still keep a
tenant from another tenant's address it has no grant to, even when it forges that tenant's source
address. The Linux backend's atomic apply is shown by traffic: a leaf rule set nftables refuses part way
leaves the previous one forwarding and filtering."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from enforcer.compiler import recompile
from enforcer.errors import ApplyError
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from lab import standalone
from lab.probe import connect, endpoint, listening, probe
from tests.enforcer.test_backends import overlapping
from tests.lab.conftest import LAB, OPEN, GoldenLab

pytestmark = LAB
FORGED = "10.2.0.77"  # inside globex's prefix, owned by nobody


@contextmanager
def forged_address(lab: GoldenLab, workload: str, addr: str) -> Iterator[None]:
    """`addr` on the workload's interface, sent from through the workload's own table (a tenant forging)."""
    w = lab.st["workloads"][workload]
    ns, table = w["netns"], 100 + [p.workload for p in lab.fabric.placements_on[w["node"]]].index(workload)
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", w["ifname"]], check=True)
    subprocess.run(["ip", "-n", ns, "rule", "add", "pref", str(table), "from", addr, "iif", "lo", "lookup",
                    str(table)], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", ns, "rule", "del", "pref", str(table), "from", addr], check=False)
        subprocess.run(["ip", "-n", ns, "addr", "del", f"{addr}/32", "dev", w["ifname"]], check=False)


def _udp_arrives(lab: GoldenLab, src_ns: str, src: str, dst_ns: str, dst: str, port: int) -> bool:
    """One datagram from src to dst:port; True when the receiver in dst_ns got it."""
    def receiver() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((dst, port))
        s.settimeout(1.0)
        return s

    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((src, 0))
            s.sendto(b"probe", (dst, port))

    rx = run_in(dst_ns, receiver)
    try:
        run_in(src_ns, send)
        try:
            return rx.recv(64) == b"probe"
        except TimeoutError:
            return False
    finally:
        rx.close()


def _nic_counter(lab: GoldenLab, device: str, where: str) -> int:
    inst = standalone.installed(lab.st, lab.fabric)
    OvsDaemons(Path(lab.st["ovs"]["rundir"])).push_stats()
    counters = standalone.backend(lab.st, device, lab.fabric).counters(inst.devices[device])
    return sum(c.packets for c in counters if c.where == where)


def test_the_supernic_drops_a_forged_source(golden_lab: GoldenLab) -> None:
    lab = golden_lab
    w1, a1 = endpoint(lab.st, "acme/train/w1"), endpoint(lab.st, "globex/api/a1")
    before = _nic_counter(lab, "nic:gpu1", "table 0 priority 0")
    with forged_address(lab, "acme/train/w1", FORGED), listening([(a1, 4, 8443)]):
        forged = run_in(w1.netns, _try_connect, FORGED, a1.ipv4, 8443)
        honest = connect(w1, a1, 8443, timeout=OPEN)[0]
    assert honest and not forged
    assert _nic_counter(lab, "nic:gpu1", "table 0 priority 0") > before  # the classifier's anti-spoofing drop


def test_a_blocked_probe_names_its_deny_while_the_source_sends_forged_traffic(golden_lab: GoldenLab) -> None:
    """Traffic from no address of the workload (here forged datagrams; after `lab up`, the interfaces' own
    IPv6 start-up traffic) moves the classifier's anti-spoofing drop during the probe: the probe still names the rule
    that refused its connection, and the anti-spoofing count is shown among the counters that moved."""
    lab = golden_lab
    inst = standalone.installed(lab.st, lab.fabric)
    b1, db1 = endpoint(lab.st, "globex/batch/b1"), endpoint(lab.st, "acme/data/db1")
    stop = threading.Event()

    def chatter() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((FORGED, 0))
            while not stop.wait(0.01):
                s.sendto(b"chatter", (db1.ipv4, 9))

    sender = threading.Thread(target=run_in, args=(b1.netns, chatter))
    with forged_address(lab, "globex/batch/b1", FORGED):
        sender.start()
        try:
            time.sleep(0.05)  # sending before the probe's first counter snapshot
            blocked = probe(lab.st, inst, "globex/batch/b1", "acme/data/db1", 5432, timeout=0.5)
        finally:
            stop.set()
            sender.join()
    assert not blocked.open and blocked.agrees
    spoofed = [m for m in blocked.moved if m["device"] == "nic:gpu1" and m["reasons"] == ["anti-spoofing"]]
    assert spoofed and spoofed[0]["packets"] > 0  # the forged datagrams were counted in the probe's window
    assert blocked.decided_by == ["nic:gpu1 table 1 priority 0: deny (default-deny)"]


def _try_connect(src: str, dst: str, port: int) -> bool:
    with socket.socket() as s:
        s.bind((src, 0))
        s.settimeout(1.0)
        try:
            s.connect((dst, port))
            return True
        except OSError:
            return False


def _open_nics_and_acls(lab: GoldenLab) -> None:
    """Every NIC: tag and forward, no policy; every leaf: no nftables table (forwarding unfiltered)."""
    daemons = OvsDaemons(Path(lab.st["ovs"]["rundir"]))
    for device, d in lab.st["devices"].items():
        if d["kind"] == "nic":
            rs = lab.compiled.devices[device]
            up = d["port_names"][rs.uplink]
            by_vlan: dict[int, list[str]] = {}
            for p in rs.ports:
                by_vlan.setdefault(p.vlan, []).append(d["port_names"][p.name])
            flows = [f"table=0,priority=10,in_port={port},actions=push_vlan:0x8100,"
                     f"set_field:{4096 + vlan}->vlan_vid,output:{up}"
                     for vlan, ports in by_vlan.items() for port in ports]
            flows += [f"table=0,priority=10,in_port={up},dl_vlan={vlan},actions=pop_vlan,"
                      + ",".join(f"output:{p}" for p in ports) for vlan, ports in by_vlan.items()]
            daemons.run("ovs-ofctl", "-O", "OpenFlow13", "--bundle", "replace-flows", daemons.mgmt(d["bridge"]), "-",
                        input="\n".join(flows) + "\n")
        else:
            def drop_table() -> None:
                import nftables

                rc, _, err = nftables.Nftables().cmd("delete table inet tf_leaf")
                assert rc == 0, err

            run_in(d["netns"], drop_table)


def test_the_leaf_vrfs_alone_keep_tenants_apart(golden_lab: GoldenLab) -> None:
    lab = golden_lab
    ep = {k: endpoint(lab.st, k) for k in lab.st["workloads"]}
    w1, w2, a1, b1 = ep["acme/train/w1"], ep["acme/train/w2"], ep["globex/api/a1"], ep["globex/batch/b1"]
    try:
        _open_nics_and_acls(lab)
        with listening([(b1, 4, 9999), (a1, 4, 9999)]):
            assert connect(w1, a1, 9999, timeout=OPEN)[0]  # the grant's leaked route: no ACL, any port passes
            # same node, same leaf: acme's VRF has no route to globex/batch
            assert not connect(w1, b1, 9999, timeout=0.7)[0]
            assert not connect(w2, b1, 9999, timeout=0.7)[0]  # across the spine: neither
        assert _udp_arrives(lab, a1.netns, a1.ipv4 or "", b1.netns, b1.ipv4 or "", 9998)  # globex to globex
        with forged_address(lab, "acme/train/w1", FORGED):  # acme claiming a globex source stays in acme's VRF
            assert not _udp_arrives(lab, w1.netns, FORGED, b1.netns, b1.ipv4 or "", 9998)
    finally:
        lab.restore()
    with listening([(b1, 4, 9999), (a1, 4, 8443)]):
        # the policy is back
        assert connect(w1, a1, 8443, timeout=OPEN)[0] and not connect(w1, a1, 9999, timeout=0.5)[0]


def test_a_leaf_set_refused_part_way_leaves_the_previous_one_in_force(golden_lab: GoldenLab) -> None:
    lab = golden_lab
    grant = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [5432], "reason": "grant:late",
             "sources": ["globex/batch"]}
    b = recompile(lab.compiled, [*lab.allowed, grant])
    inst = standalone.installed(lab.st, lab.fabric)
    leaf = standalone.backend(lab.st, "leaf:leaf1", lab.fabric)
    try:
        for nic in ("nic:gpu1", "nic:gpu2"):  # the NICs already allow it: only the leaf stands in the way
            standalone.backend(lab.st, nic, lab.fabric).apply(b.devices[nic])
        before = leaf.installed()
        assert not probe(lab.st, inst, "globex/batch/b1", "acme/data/db1", 5432, timeout=0.5).open
        with pytest.raises(ApplyError, match="nftables refused"):
            leaf.apply(overlapping(b.devices["leaf:leaf1"]))
        assert leaf.installed() == before and leaf.drift(lab.compiled.devices["leaf:leaf1"]) == []
        blocked = probe(lab.st, inst, "globex/batch/b1", "acme/data/db1", 5432, timeout=0.5)
        assert not blocked.open
        assert probe(lab.st, inst, "acme/train/w1", "acme/data/db1", 5432, timeout=OPEN).open  # still forwarding
        leaf.apply(b.devices["leaf:leaf1"])
        assert probe(lab.st, inst, "globex/batch/b1", "acme/data/db1", 5432, timeout=OPEN).open
    finally:
        lab.restore()
