"""Real TCP and UDP between network namespaces through two SuperNIC bridges running the compiled flows.

gpu1's and gpu2's rule sets from the small fabric go into two bridges of a private ovs-vswitchd (userspace
datapath, in the session's OVS namespace, where the bridges' ends of the veths live too); the bridges'
uplinks are joined by a veth pair (a wire standing in for the leaf). acme/train/w1 (gpu1) and acme/data/db1
(gpu2) each live in a namespace and listen on 443 and 5432: only the connections the policy allows complete,
in both directions of the TCP handshake (conntrack return). globex/batch/b1 (gpu1) lives in a third one.

RoCEv2 (UDP to 4791) skips conntrack (NVIDIA's BlueField CT offload guide: hardware CT does not take RoCE):
with a grant acme/train -> acme/data on udp 4791 and 9000, datagrams to 4791 pass both ways with no `ct` in
the datapath flows they make (`ovs-appctl dpctl/dump-flows`, this test's own daemons), while udp/9000 and
TCP of the same pair still go through conntrack.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from enforcer.backends.ovs import OvsBackend
from enforcer.compiler import Compiled, compile_fabric
from enforcer.fabric import revoked_ids
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from tests.enforcer.helpers import allowed_flows, compile_small, small

SERVER = (
    "import socket,sys,threading\n"
    "def serve(p):\n"
    "    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(('0.0.0.0',p)); s.listen()\n"
    "    while True:\n"
    "        c,_=s.accept(); c.close()\n"
    "for p in map(int, sys.argv[1:]): threading.Thread(target=serve,args=(p,),daemon=True).start()\n"
    "print('ready',flush=True); threading.Event().wait()\n"
)
CLIENT = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()"


def _sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


ROCE = {"dst_tenant": "acme", "dst_group": "data", "proto": "udp", "ports": [4791, 9000], "reason": "grant:roce",
        "sources": ["acme/train"]}
ADDR = {"w1": "10.1.0.11", "db1": "10.1.0.21", "b1": "10.2.0.21"}


@pytest.fixture
def two_nodes(ovs_daemons: OvsDaemons) -> Iterator[dict[str, str]]:
    with _wired(ovs_daemons, compile_small()[0]) as ns:
        yield ns


@pytest.fixture
def roce_nodes(ovs_daemons: OvsDaemons) -> Iterator[dict[str, str]]:
    """The same two nodes with the grant acme/train -> acme/data on udp 4791 (RoCEv2) and 9000."""
    f = small()
    with _wired(ovs_daemons, compile_fabric(f, [*allowed_flows(f), ROCE], revoked_ids(f))) as ns:
        yield ns


@contextmanager
def _wired(ovs_daemons: OvsDaemons, compiled: Compiled) -> Iterator[dict[str, str]]:
    """Namespaces w1, db1, b1 (by name) wired to the bridges `gpu1` and `gpu2` (their names under those keys)
    running the compile's rule sets."""
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool not installed (Debian package ethtool): veth checksum offload must be off")
    tok = secrets.token_hex(2)
    ovs_ns = ovs_daemons.netns
    assert ovs_ns is not None
    ns = {"w1": f"tfw{tok}{os.getpid() % 1000}a", "db1": f"tfw{tok}{os.getpid() % 1000}b",
          "b1": f"tfw{tok}{os.getpid() % 1000}c"}
    br = {"gpu1": f"tfb{tok}1", "gpu2": f"tfb{tok}2"}
    links: list[str] = []
    servers: list[subprocess.Popen[str]] = []
    try:
        for b in br.values():
            ovs_daemons.add_bridge(b)
        here = ["ip", "-n", ovs_ns]  # the daemons' namespace: the bridges' side of every veth lives there
        _sh(*here, "link", "add", f"tf{tok}ua", "type", "veth", "peer", "name", f"tf{tok}ub")
        links.append(f"tf{tok}ua")
        for end, b in ((f"tf{tok}ua", br["gpu1"]), (f"tf{tok}ub", br["gpu2"])):
            _sh("ip", "netns", "exec", ovs_ns, "ethtool", "-K", end, "tx", "off")
            _sh(*here, "link", "set", end, "up")
            ovs_daemons.add_port(b, end)
        for w, addr, b, host in (("w1", ADDR["w1"], br["gpu1"], f"tf{tok}h1"),
                                 ("db1", ADDR["db1"], br["gpu2"], f"tf{tok}h2"),
                                 ("b1", ADDR["b1"], br["gpu1"], f"tf{tok}x1")):
            _sh("ip", "netns", "add", ns[w])
            _sh(*here, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns[w])
            links.append(host)
            _sh("ip", "netns", "exec", ovs_ns, "ethtool", "-K", host, "tx", "off")
            _sh("ip", "netns", "exec", ns[w], "ethtool", "-K", "eth0", "tx", "off")
            _sh(*here, "link", "set", host, "up")
            _sh("ip", "-n", ns[w], "addr", "add", f"{addr}/16", "dev", "eth0")
            _sh("ip", "-n", ns[w], "link", "set", "eth0", "up")
            _sh("ip", "-n", ns[w], "link", "set", "lo", "up")
            ovs_daemons.add_port(b, host)
        # globex/batch/b1 reaches acme's addresses on the wire (no leaf, no VRF here), so what stops it is the NIC
        _sh("ip", "-n", ns["b1"], "route", "add", "10.1.0.0/16", "dev", "eth0")
        _sh("ip", "-n", ns["b1"], "neigh", "add", ADDR["db1"], "lladdr", _mac(ns["db1"]), "dev", "eth0")
        OvsBackend(ovs_daemons, br["gpu1"], {"p0": f"tf{tok}ua", "pf0vf0": f"tf{tok}h1", "pf0vf1": f"tf{tok}x1"}
                   ).apply(compiled.devices["nic:gpu1"])
        OvsBackend(ovs_daemons, br["gpu2"], {"p0": f"tf{tok}ub", "pf0vf0": f"tf{tok}h2"}
                   ).apply(compiled.devices["nic:gpu2"])
        for w in ("w1", "db1"):
            proc = subprocess.Popen(["ip", "netns", "exec", ns[w], sys.executable, "-c", SERVER, "443", "5432"],
                                    stdout=subprocess.PIPE, text=True)
            servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield {**ns, **br}
    finally:
        for proc in servers:
            proc.kill()
            proc.wait(timeout=10)
        for n in ns.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        for link in links:
            subprocess.run(["ip", "-n", ovs_ns, "link", "del", link], capture_output=True)
        for b in br.values():
            ovs_daemons.del_bridge(b)


def _connects(ns: str, addr: str, port: int) -> bool:
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, addr, str(port)],
                          capture_output=True, timeout=20)
    return proc.returncode == 0


def test_tcp_is_allowed_and_denied_as_the_policy_says(two_nodes: dict[str, str]) -> None:
    deadline = time.monotonic() + 5  # the first ARP exchange may take a moment on a fresh bridge
    while not _connects(two_nodes["w1"], "10.1.0.21", 5432) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _connects(two_nodes["w1"], "10.1.0.21", 5432)  # acme/train -> acme/data:5432 (intra-tenant)
    assert _connects(two_nodes["db1"], "10.1.0.11", 443)  # acme/data -> acme/train:443 (intra-tenant)
    assert not _connects(two_nodes["db1"], "10.1.0.11", 5432)  # acme/train does not expose 5432
    assert not _connects(two_nodes["w1"], "10.1.0.21", 443)  # acme/data does not expose 443


# ---------------------------------------------------------------- RoCEv2: no conntrack, both ways

def _mac(ns: str) -> str:
    out = subprocess.run(["ip", "-n", ns, "-br", "link", "show", "eth0"], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()[2]


def _bound(addr: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    s.settimeout(1.0)
    return s


def _datagram(src_ns: str, src: str, sport: int, dst_ns: str, dst: str, dport: int, tries: int = 1) -> bool:
    """One datagram src:sport -> dst:dport (again, up to `tries` times: the first waits for ARP on a fresh
    bridge); True when the receiver in dst_ns got it from that source address and port."""
    rx = run_in(dst_ns, _bound, dst, dport)
    tx = run_in(src_ns, _bound, src, sport)
    try:
        for _ in range(tries):
            tx.sendto(b"roce", (dst, dport))
            try:
                data, peer = rx.recvfrom(64)
            except TimeoutError:
                continue
            return data == b"roce" and peer == (src, sport)
        return False
    finally:
        rx.close()
        tx.close()


def _dp_flows(ovs: OvsDaemons, src: str, dst: str, proto: int) -> list[str]:
    """The datapath flows (what OVS-DOCA would put in the NIC) that IPv4 packets src -> dst of one protocol
    can hit: a megaflow leaves out (or masks) an address its OpenFlow walk did not look at."""
    out = ovs.run("ovs-appctl", "-t", f"{ovs.rundir}/vswitchd.ctl", "dpctl/dump-flows").stdout
    found = []
    for line in out.splitlines():
        m = re.search(r"ipv4\(([^)]*)\)", line)
        if m is None:
            continue
        fields = dict(kv.split("=", 1) for kv in m.group(1).split(","))
        if fields.get("proto") == str(proto) and all(
                fields.get(k, want) == want or "/" in fields[k] for k, want in (("src", src), ("dst", dst))):
            found.append(line)
    return found


def _flush_dp(ovs: OvsDaemons) -> None:
    ovs.run("ovs-appctl", "-t", f"{ovs.rundir}/vswitchd.ctl", "dpctl/del-flows")


def _roce_drops(ovs: OvsDaemons, bridge: str) -> int:
    """Packets the bridge's RoCEv2 default deny (table 5, priority 0) dropped."""
    ovs.push_stats()
    out = ovs.run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", ovs.mgmt(bridge), "table=5").stdout
    return sum(int(n) for n in re.findall(r"n_packets=(\d+),.*priority=0 actions=drop", out))


def test_roce_passes_both_ways_and_its_datapath_flows_have_no_ct(roce_nodes: dict[str, str],
                                                                  ovs_daemons: OvsDaemons) -> None:
    ns, w1, db1 = roce_nodes, ADDR["w1"], ADDR["db1"]
    _flush_dp(ovs_daemons)
    # the grant's direction: acme/train -> acme/data, to 4791 from a varying source port
    assert _datagram(ns["w1"], w1, 50001, ns["db1"], db1, 4791, tries=10)
    # RoCEv2 responses and ACKs: db1 -> w1, also to 4791, from another port: no conntrack entry would match it
    assert _datagram(ns["db1"], db1, 50002, ns["w1"], w1, 4791, tries=3)
    there, back = _dp_flows(ovs_daemons, w1, db1, 17), _dp_flows(ovs_daemons, db1, w1, 17)
    assert there and back
    assert all("dst=4791)" in line and "ct(" not in line for line in there + back), "\n".join(there + back)


def test_roce_from_a_pair_no_policy_allows_drops_in_the_roce_table(roce_nodes: dict[str, str],
                                                                   ovs_daemons: OvsDaemons) -> None:
    ns = roce_nodes
    assert _datagram(ns["w1"], ADDR["w1"], 50005, ns["db1"], ADDR["db1"], 4791, tries=10)  # the wire works
    before = _roce_drops(ovs_daemons, ns["gpu1"])
    # globex/batch/b1 holds no grant to acme/data: its RoCEv2 stops at its own NIC, before any conntrack
    assert not _datagram(ns["b1"], ADDR["b1"], 50006, ns["db1"], ADDR["db1"], 4791, tries=2)
    assert _roce_drops(ovs_daemons, ns["gpu1"]) >= before + 2


def test_the_grants_other_port_and_tcp_still_go_through_conntrack(roce_nodes: dict[str, str],
                                                                  ovs_daemons: OvsDaemons) -> None:
    ns, w1, db1 = roce_nodes, ADDR["w1"], ADDR["db1"]
    _flush_dp(ovs_daemons)
    rx = run_in(ns["db1"], _bound, db1, 9000)
    tx = run_in(ns["w1"], _bound, w1, 50003)
    try:
        for _ in range(10):  # the first may wait for ARP
            tx.sendto(b"ping", (db1, 9000))
            try:
                data, peer = rx.recvfrom(64)
                break
            except TimeoutError:
                continue
        else:
            pytest.fail("udp/9000 of the grant did not arrive")
        assert (data, peer) == (b"ping", (w1, 50003))
        rx.sendto(b"pong", peer)  # the reply, admitted as conntrack return
        assert tx.recvfrom(64) == (b"pong", (db1, 9000))
    finally:
        rx.close()
        tx.close()
    flows = _dp_flows(ovs_daemons, w1, db1, 17) + _dp_flows(ovs_daemons, db1, w1, 17)
    assert flows and any("ct(" in line for line in flows), "\n".join(flows)
    assert not any("dst=4791)" in line for line in flows)
    # the grant's other port is not symmetric: db1 may not open udp/9000 towards w1
    assert not _datagram(ns["db1"], db1, 50004, ns["w1"], w1, 9000, tries=2)
    # TCP between the pair still goes through conntrack, and a reply-less new connection back still drops
    _flush_dp(ovs_daemons)
    assert _connects(ns["w1"], db1, 5432)  # acme/train -> acme/data:5432 (intra-tenant)
    tcp = _dp_flows(ovs_daemons, w1, db1, 6)
    assert tcp and any("ct(" in line for line in tcp), "\n".join(tcp)
    assert not _connects(ns["db1"], w1, 5432)  # acme/train does not expose 5432: db1 opens nothing to w1
