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

import ipaddress
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest

from core.rocev2 import ROCE_V2_PORT
from enforcer.backends.ovs import OvsBackend, _NewConnections
from enforcer.compiler import Compiled, compile_fabric
from enforcer.fabric import revoked_ids
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons, Unixctl
from tests.enforcer.helpers import allowed_flows, compile_small, small
from tests.flow_watch import connect_from, echo_server

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
    running the compile's rule sets; `wire2` names gpu2's end of the wire between the bridges."""
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool not installed (Debian package ethtool): veth checksum offload must be off")
    tok = secrets.token_hex(2)
    ovs_ns = ovs_daemons.netns
    assert ovs_ns is not None
    ns = {"w1": f"tfw{tok}{os.getpid() % 1000}a", "db1": f"tfw{tok}{os.getpid() % 1000}b",
          "b1": f"tfw{tok}{os.getpid() % 1000}c"}
    br = {"gpu1": f"tfb{tok}1", "gpu2": f"tfb{tok}2"}
    links: list[str] = []
    servers = ExitStack()  # the echo servers: closed first, before the namespaces they run in go
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
        for node, backend in backends(ovs_daemons, br, tok).items():
            backend.apply(compiled.devices[f"nic:{node}"])
        for w in ("w1", "db1"):
            servers.enter_context(echo_server(ns[w], 443, 5432))
        # wire2: gpu2's end of the wire between the bridges; tok: what backends() names the ports by
        yield {**ns, **br, "wire2": f"tf{tok}ub", "tok": tok}
    finally:
        servers.close()
        for n in ns.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        for link in links:
            subprocess.run(["ip", "-n", ovs_ns, "link", "del", link], capture_output=True)
        for b in br.values():
            ovs_daemons.del_bridge(b)


def backends(ovs_daemons: OvsDaemons, bridges: dict[str, str], tok: str) -> dict[str, OvsBackend]:
    """The SuperNIC backends of the wired nodes gpu1 and gpu2 (their bridges, their ports' veth names)."""
    return {"gpu1": OvsBackend(ovs_daemons, bridges["gpu1"],
                               {"p0": f"tf{tok}ua", "pf0vf0": f"tf{tok}h1", "pf0vf1": f"tf{tok}x1"}),
            "gpu2": OvsBackend(ovs_daemons, bridges["gpu2"], {"p0": f"tf{tok}ub", "pf0vf0": f"tf{tok}h2"})}


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


# ---------------------------------------------------------------- VLAN tags from a workload: untagged only
# A workload that sends an 802.1Q (or 802.1ad) tagged frame with its own source address must not get it onto
# the fabric: table 0 would accept it and table 3's push_vlan would tag it again, so a double-tagged frame
# (outer: the tenant's VLAN, inner: the workload's choice) would leave on the uplink. Frames are written raw
# (AF_PACKET) in the workload's namespace and read raw on the far end of the wire, where gpu1's uplink leads.

ETH_P_ALL, SOL_PACKET, PACKET_AUXDATA = 0x0003, 263, 8
TP_STATUS_VLAN_VALID, TP_STATUS_VLAN_TPID_VALID = 0x10, 0x40
AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata


def _csum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of data."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _udp4(src: str, dst: str, sport: int, dport: int, payload: bytes) -> tuple[int, bytes]:
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload  # checksum 0: none (IPv4 only)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                      socket.inet_aton(src), socket.inet_aton(dst))
    return 0x0800, hdr[:10] + struct.pack("!H", _csum(hdr)) + hdr[12:] + udp


def _arp_request(mac: str, src: str, dst: str) -> tuple[int, bytes]:
    return 0x0806, struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, bytes.fromhex(mac.replace(":", "")),
                               socket.inet_aton(src), b"\0" * 6, socket.inet_aton(dst))


def _neighbor_solicitation(mac: str, src: str, target: str) -> tuple[int, bytes]:
    s6, t6 = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, target)
    body = struct.pack("!BBHI16sBB6s", 135, 0, 0, 0, t6, 1, 1, bytes.fromhex(mac.replace(":", "")))
    group = bytes.fromhex("ff0200000000000000000001ff") + t6[13:]  # the target's solicited-node group
    body = body[:2] + struct.pack("!H", _csum(s6 + group + struct.pack("!IxxxB", len(body), 58) + body)) + body[4:]
    return 0x86DD, struct.pack("!IHBB16s16s", 6 << 28, len(body), 58, 255, s6, group) + body


def _neighbor_advertisement(mac: str, src: str, target: str) -> tuple[int, bytes]:
    """An unsolicited NA (override set) from `src` to all nodes: `target` is at `mac`."""
    s6, t6 = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, target)
    body = struct.pack("!BBHI16sBB6s", 136, 0, 0, 0x20000000, t6, 2, 1, bytes.fromhex(mac.replace(":", "")))
    group = bytes.fromhex("ff020000000000000000000000000001")
    body = body[:2] + struct.pack("!H", _csum(s6 + group + struct.pack("!IxxxB", len(body), 58) + body)) + body[4:]
    return 0x86DD, struct.pack("!IHBB16s16s", 6 << 28, len(body), 58, 255, s6, group) + body


def _frame(dst_mac: str, src_mac: str, packet: tuple[int, bytes], tags: tuple[tuple[int, int], ...],
           token: bytes) -> bytes:
    """An Ethernet frame: the given (TPID, TCI) tags outermost first, then the packet; the token rides in the
    trailer after it (padding to any receiver, which reads the IP or ARP length), so the frame is found on the
    wire whatever was done to its headers."""
    ethertype, payload = packet
    head = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
    return head + b"".join(struct.pack("!HH", tpid, tci) for tpid, tci in tags) + struct.pack(
        "!H", ethertype) + payload + token


def _raw_socket(ifname: str, timeout: float) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((ifname, 0))
    s.settimeout(timeout)
    return s


def _vlan_tags(frame: bytes) -> list[str]:
    """A frame's VLAN tags, outermost first, as "<TPID> vid <VID>"."""
    tags, at = [], 12
    while struct.unpack_from("!H", frame, at)[0] in (0x8100, 0x88A8):
        tpid, tci = struct.unpack_from("!HH", frame, at)
        tags.append(f"{tpid:#06x} vid {tci & 0xFFF}")
        at += 4
    return tags


def _on_the_wire(capture: socket.socket, tokens: set[bytes], until: bytes, resend: Callable[[], None]
                 ) -> dict[bytes, list[str]]:
    """token -> the VLAN tags of the captured frame that carries it: send, read until the wire is quiet (the
    capture's timeout), and again (at most 5 times: the first may meet a fresh bridge) until `until` was seen.
    Reading on until quiet also catches a frame the switch sent after `until`. A receiving kernel takes the
    outer tag off into the packet's metadata; it is put back here, so a frame is seen as it was on the wire."""
    seen: dict[bytes, list[str]] = {}
    for _ in range(5):
        resend()
        while True:
            try:
                data, anc, _flags, _addr = capture.recvmsg(65535, socket.CMSG_SPACE(AUXDATA.size))
            except TimeoutError:
                break
            for level, kind, value in anc:
                if level == SOL_PACKET and kind == PACKET_AUXDATA and len(value) >= AUXDATA.size:
                    status, _len, _snap, _mac, _net, tci, tpid = AUXDATA.unpack_from(value)
                    if status & TP_STATUS_VLAN_VALID:
                        tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                        data = data[:12] + struct.pack("!HH", tpid, tci) + data[12:]
            for token in tokens:
                if data.endswith(token):
                    seen[token] = _vlan_tags(data)
        if until in seen:
            break
    return seen


def test_a_workload_cannot_put_a_vlan_tag_on_the_fabric(roce_nodes: dict[str, str],
                                                        ovs_daemons: OvsDaemons) -> None:
    """Each kind of frame a workload may send (IP through conntrack, RoCEv2, ARP, IPv6 ND) goes out tagged
    with its tenant's VLAN when the workload sends it untagged; the same frame with an 802.1Q tag, an 802.1ad
    tag or an 802.1Q priority tag (VID 0, PCP 3: how a PCP-classified PFC class is marked without a VLAN)
    never leaves the NIC."""
    ns, w1, db1 = roce_nodes, ADDR["w1"], ADDR["db1"]
    mac, peer = _mac(ns["w1"]), _mac(ns["db1"])
    acme_vlan = 101  # acme's VLAN in the small fabric: the only tag a frame of w1 may carry on the wire
    kinds = {
        "udp through conntrack": (peer, _udp4(w1, db1, 50010, 9000, b"tagged?")),
        "rocev2": (peer, _udp4(w1, db1, 50011, 4791, b"tagged?")),
        "arp": ("ff:ff:ff:ff:ff:ff", _arp_request(mac, w1, db1)),
        "ipv6 nd": ("33:33:ff:00:00:21", _neighbor_solicitation(mac, "fd00:1::11", "fd00:1::21")),
    }
    tags = {"802.1q vid 7": ((0x8100, 7),), "802.1ad vid 7": ((0x88A8, 7),),
            "802.1q priority tag": ((0x8100, 3 << 13),)}
    assert ovs_daemons.netns is not None
    capture = run_in(ovs_daemons.netns, _raw_socket, ns["wire2"], 0.2)
    sender = run_in(ns["w1"], _raw_socket, "eth0", 1.0)
    try:
        found: dict[str, object] = {}
        for kind, (dst_mac, packet) in kinds.items():
            plain = secrets.token_bytes(12)
            tagged = {secrets.token_bytes(12): name for name in tags}
            frames = [_frame(dst_mac, mac, packet, tags[name], token) for token, name in tagged.items()]
            frames.append(_frame(dst_mac, mac, packet, (), plain))  # last: when it is seen, the others had their turn

            def send(frames: list[bytes] = frames) -> None:
                for f in frames:
                    sender.send(f)

            seen = _on_the_wire(capture, {plain, *tagged}, plain, send)
            found[f"{kind} untagged"] = seen.get(plain)
            for token, name in tagged.items():
                found[f"{kind} {name}"] = seen.get(token)
        expected: dict[str, object] = {f"{kind} untagged": [f"0x8100 vid {acme_vlan}"] for kind in kinds}
        expected.update({f"{kind} {name}": None for kind in kinds for name in tags})
        assert found == expected
    finally:
        capture.close()
        sender.close()
    # and the workload's untagged traffic still arrives at db1, through conntrack and as RoCEv2
    assert _datagram(ns["w1"], w1, 50012, ns["db1"], db1, 9000, tries=3)
    assert _datagram(ns["w1"], w1, 50013, ns["db1"], db1, 4791, tries=3)


def test_a_workload_advertises_only_its_own_ipv6_address(roce_nodes: dict[str, str], ovs_daemons: OvsDaemons) -> None:
    """An IPv6 Neighbor Advertisement names its target in the ICMPv6 body, not in the IPv6 source: w1 (fd00:1::11)
    advertising db1's fd00:1::21 as at its own MAC (override set) would have the leaf send db1's traffic to w1's
    attachment, where it is dropped (db1 blackholed for everything routed through that leaf). It never leaves the
    NIC; w1's advertisement of its own address does, tagged with acme's VLAN."""
    ns = roce_nodes
    mac = _mac(ns["w1"])
    assert ovs_daemons.netns is not None
    capture = run_in(ovs_daemons.netns, _raw_socket, ns["wire2"], 0.2)
    sender = run_in(ns["w1"], _raw_socket, "eth0", 1.0)
    try:
        own, spoofed = secrets.token_bytes(12), secrets.token_bytes(12)
        frames = [_frame("33:33:00:00:00:01", mac, _neighbor_advertisement(mac, "fd00:1::11", "fd00:1::21"), (),
                         spoofed),
                  _frame("33:33:00:00:00:01", mac, _neighbor_advertisement(mac, "fd00:1::11", "fd00:1::11"), (),
                         own)]  # last: when it is seen, the spoofed one had its turn

        def send() -> None:
            for f in frames:
                sender.send(f)

        seen = _on_the_wire(capture, {own, spoofed}, own, send)
        assert seen == {own: ["0x8100 vid 101"]}
    finally:
        capture.close()
        sender.close()


def test_a_withdrawn_flow_takes_its_established_connections_with_it(two_nodes: dict[str, str],
                                                                    ovs_daemons: OvsDaemons) -> None:
    """A connection committed while its flow was allowed passed every later packet through the `+est` rule, on
    both NICs, after the flow was withdrawn (its exposure gone, its workload revoked, its grant expired): new
    connections were refused but the open one ran on. Applying a rule set now cuts the connections it no longer
    admits, and leaves the ones it still admits alone."""
    ns = two_nodes
    cut = run_in(ns["w1"], connect_from, ADDR["w1"], ADDR["db1"], 5432)  # acme/train -> acme/data:5432
    kept = run_in(ns["db1"], connect_from, ADDR["db1"], ADDR["w1"], 443)  # acme/data -> acme/train:443
    try:
        assert_echoes(cut, kept)
        withdrawn = data_withdrawn()  # acme/data exposes tcp/5432 no more: only that entry goes
        for node, backend in backends(ovs_daemons, {"gpu1": ns["gpu1"], "gpu2": ns["gpu2"]}, ns["tok"]).items():
            backend.apply(withdrawn.devices[f"nic:{node}"])
        assert not _connects(ns["w1"], ADDR["db1"], 5432)  # a new connection is refused
        kept.sendall(b"after")
        assert kept.recv(16) == b"after"  # the connection still allowed runs on
        assert_cut(cut)
    finally:
        cut.close()
        kept.close()


def _spray(src: str, dst: str, dport: int, sports: range) -> None:
    """One datagram src:sport -> dst:dport from each source port: as many conntrack entries (call it inside the
    source's namespace)."""
    for k, sport in enumerate(sports):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind((src, sport))
            s.sendto(b"x", (dst, dport))
        finally:
            s.close()
        if k % 200 == 199:
            time.sleep(0.01)  # the userspace datapath drops what comes faster than its upcalls


def _udp_entries(ovs: OvsDaemons, zone: int, dport: int) -> int:
    out = ovs.run("ovs-appctl", "-t", f"{ovs.rundir}/vswitchd.ctl", "dpctl/dump-conntrack", f"zone={zone}").stdout
    return sum(1 for line in out.splitlines() if line.startswith("udp,") and f"dport={dport})" in line)


def test_an_apply_cuts_ten_thousand_withdrawn_connections_in_bounded_time(roce_nodes: dict[str, str],
                                                                          ovs_daemons: OvsDaemons) -> None:
    """A NIC carrying 10,000 connections of a grant that is revoked: the apply that withdraws it cut them one
    `ovs-appctl` process each (~5 ms: close to a minute for the apply, during which the agent's device thread
    applied nothing else); now one unixctl connection carries every request and each distinct flow is decided
    once. The allowed connection beside them stays."""
    ns, w1, db1, n = roce_nodes, ADDR["w1"], ADDR["db1"], 10_000
    assert _datagram(ns["w1"], w1, 20000, ns["db1"], db1, 9000, tries=10)  # the wire works (ARP done)
    for _ in range(5):  # again for the datagrams dropped on the way: a repeated one makes no second entry
        if _udp_entries(ovs_daemons, 101, 9000) >= n + 1:
            break
        run_in(ns["w1"], _spray, w1, db1, 9000, range(20001, 20001 + n))
    assert _udp_entries(ovs_daemons, 101, 9000) >= n + 1
    kept = run_in(ns["db1"], connect_from, db1, w1, 443)  # acme/data -> acme/train:443, allowed throughout
    try:
        f = small()
        withdrawn = compile_fabric(f, allowed_flows(f), revoked_ids(f))  # the RoCEv2/9000 grant revoked
        started = time.monotonic()
        for node, backend in backends(ovs_daemons, {"gpu1": ns["gpu1"], "gpu2": ns["gpu2"]}, ns["tok"]).items():
            backend.apply(withdrawn.devices[f"nic:{node}"])
        took = time.monotonic() - started
        assert _udp_entries(ovs_daemons, 101, 9000) == 0
        assert took < 10, f"two applies cutting {n} connections took {took:.1f} s"
        kept.settimeout(3)
        kept.sendall(b"after")
        assert kept.recv(16) == b"after"
    finally:
        kept.close()


def test_a_cut_that_fails_leaves_the_new_flows_applied_and_shows_as_drift(two_nodes: dict[str, str],
                                                                          ovs_daemons: OvsDaemons) -> None:
    """The flows are committed before the cut: a cut that failed (the daemon's control socket out of reach) was an
    ApplyError, so the agent kept the previous set as its last good one and its drift repair put that set back, the
    withdrawn allow with it. Now the apply stands, the connection it could not cut is drift, and the next drift
    check, once the socket answers, cuts it."""
    ns = two_nodes
    conn = run_in(ns["w1"], connect_from, ADDR["w1"], ADDR["db1"], 5432)  # acme/train -> acme/data:5432
    ctl = ovs_daemons.rundir / "vswitchd.ctl"
    away = ctl.with_name("vswitchd.ctl.away")
    try:
        assert_echoes(conn)
        withdrawn = data_withdrawn()
        nics = backends(ovs_daemons, {"gpu1": ns["gpu1"], "gpu2": ns["gpu2"]}, ns["tok"])
        ctl.rename(away)
        try:
            for node, backend in nics.items():
                backend.apply(withdrawn.devices[f"nic:{node}"])  # no ApplyError: the new flows are in force
            drift = nics["gpu1"].drift(withdrawn.devices["nic:gpu1"])
            assert drift and all(line.startswith("conntrack: ") for line in drift), drift
        finally:
            away.rename(ctl)
        for node, backend in nics.items():  # the agent's next drift check: the socket answers, the cut is made
            assert backend.drift(withdrawn.devices[f"nic:{node}"]) == []
        assert_cut(conn)
    finally:
        conn.close()


def test_a_withdrawn_flow_takes_its_ipv6_connections_with_it(two_nodes: dict[str, str],
                                                             ovs_daemons: OvsDaemons) -> None:
    """The same over IPv6 (the conntrack entry is matched by its ct_ipv6_* fields): the withdrawn connection goes,
    the one still allowed stays."""
    ns, w1, db1 = two_nodes, "fd00:1::11", "fd00:1::21"
    for w, addr in (("w1", w1), ("db1", db1)):
        _sh("ip", "-n", ns[w], "-6", "addr", "add", f"{addr}/64", "dev", "eth0", "nodad")
    cut = run_in(ns["w1"], connect_from, w1, db1, 5432)
    kept = run_in(ns["db1"], connect_from, db1, w1, 443)
    try:
        assert_echoes(cut, kept)
        withdrawn = data_withdrawn()
        nics = backends(ovs_daemons, {"gpu1": ns["gpu1"], "gpu2": ns["gpu2"]}, ns["tok"])
        removed = [x for node, backend in nics.items()
                   for x in backend.forget_withdrawn(withdrawn.devices[f"nic:{node}"])]
        assert removed and all(f"{w1}:" in x and f"{db1}:5432" in x for x in removed), removed
        for node, backend in nics.items():
            backend.apply(withdrawn.devices[f"nic:{node}"])
        kept.sendall(b"after")
        assert kept.recv(16) == b"after"
        assert_cut(cut)
    finally:
        cut.close()
        kept.close()


def assert_echoes(*conns: socket.socket) -> None:
    """Each connection carries traffic now (the echo server answers)."""
    for conn in conns:
        conn.settimeout(3)
        conn.sendall(b"before")
        assert conn.recv(16) == b"before"


def data_withdrawn() -> Compiled:
    """The small fabric compiled without acme/data's entries: its tcp/5432 exposure withdrawn."""
    f = small()
    return compile_fabric(f, [e for e in allowed_flows(f) if e["dst_group"] != "data"], revoked_ids(f))


def assert_cut(conn: socket.socket) -> None:
    """The connection carries nothing any more: a write gets no echo (TimeoutError) or the peer resets or closes it."""
    conn.settimeout(1.5)
    conn.sendall(b"after")
    with pytest.raises(OSError):
        if conn.recv(16) == b"":
            raise ConnectionResetError("closed")


RANGES = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [*range(1000, 1100), 3000, 3001, 3002],
          "reason": "grant:ranges", "sources": ["acme/train", "globex/batch"]}


def _traced_allow(ctl: Unixctl, bridge: str, flow: str) -> bool:
    """Whether the bridge's OpenFlow pipeline sends a `+new` packet of `flow` anywhere (ofproto/trace, conntrack
    answering trk,new at each ct): the verdict the NIC gives a new connection."""
    out = ctl("ofproto/trace", bridge, flow, "--ct-next", "trk,new")
    actions: list[str] = re.findall(r"^Datapath actions: (.*)$", out, flags=re.MULTILINE)
    return actions[-1].strip() != "drop"


def test_the_conntrack_cut_decides_new_connections_as_the_openflow_pipeline_does(ovs_daemons: OvsDaemons) -> None:
    """forget_withdrawn decides from the IR which connections a rule set still admits, beside the renderer: asked
    of every (direction, local and remote address, protocol, port at and around each rule's range edges, IPv4
    and IPv6) on the two NICs, it answers as OVS's own trace of a `+new` packet through the rendered flows
    (plain and conjunctive allows, port masks, RoCEv2's port carved out of udp). A divergence would cut allowed
    connections ("not admitted") or leave revoked ones open ("admitted")."""
    f = small()
    compiled = compile_fabric(f, [*allowed_flows(f), ROCE, RANGES], revoked_ids(f))
    with _wired(ovs_daemons, compiled) as ns:
        nics = backends(ovs_daemons, {"gpu1": ns["gpu1"], "gpu2": ns["gpu2"]}, ns["tok"])
        checked = 0
        with ovs_daemons.unixctl() as ctl:
            for node, backend in nics.items():
                rs = compiled.devices[f"nic:{node}"]
                admits = _NewConnections(rs)
                remote = sorted({ipaddress.ip_interface(a).ip for s in rs.sets for a in (*s.v4, *s.v6)}
                                | {ipaddress.ip_address("10.9.9.9"), ipaddress.ip_address("fd00:9::9")}, key=str)
                ports = sorted({p for r in rs.rules if r.state == "new" for lo, hi in r.ports
                                for p in (lo - 1, lo, hi, hi + 1)} | {1, 22, 65535} - {ROCE_V2_PORT})
                for port_ in rs.ports:
                    name = backend.port_names.get(port_.name, port_.name)
                    uplink = backend.port_names.get(rs.uplink, rs.uplink)
                    for local in (ipaddress.ip_interface(a).ip for a in (*port_.v4, *port_.v6)):
                        fam = "nw" if local.version == 4 else "ipv6"
                        for peer in (a for a in remote if a.version == local.version and a != local):
                            for proto in ("tcp", "udp"):
                                kind = proto if local.version == 4 else f"{proto}6"
                                for dport in ports:
                                    out = (f"in_port={name},vlan_tci=0,{kind},{fam}_src={local},{fam}_dst={peer},"
                                           f"{proto}_src=40000,{proto}_dst={dport}")
                                    into = (f"in_port={uplink},dl_vlan={port_.vlan},{kind},{fam}_src={peer},"
                                            f"{fam}_dst={local},{proto}_src=40000,{proto}_dst={dport}")
                                    for direction, flow, s, d in (("egress", out, local, peer),
                                                                  ("ingress", into, peer, local)):
                                        want = _traced_allow(ctl, backend.bridge, flow)
                                        assert admits(direction, s, d, proto, dport) == want, (node, flow, want)
                                        checked += 1
        assert checked > 1000, checked
