"""Real TCP between two network namespaces through two SuperNIC bridges running the compiled flows.

gpu1's and gpu2's rule sets from the small fabric go into two bridges of a private ovs-vswitchd (userspace
datapath, in the session's OVS namespace, where the bridges' ends of the veths live too); the bridges'
uplinks are joined by a veth pair (a wire standing in for the leaf). acme/train/w1
(gpu1) and acme/data/db1 (gpu2) each live in a namespace and listen on 443 and 5432: only the connections
the policy allows complete, in both directions of the TCP handshake (conntrack return).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from enforcer.backends.ovs import OvsBackend
from enforcer.ovsd import OvsDaemons
from tests.enforcer.helpers import compile_small

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


@pytest.fixture
def two_nodes(ovs_daemons: OvsDaemons) -> Iterator[dict[str, str]]:
    if shutil.which("ethtool") is None:
        pytest.skip("ethtool not installed (Debian package ethtool): veth checksum offload must be off")
    tok = secrets.token_hex(2)
    ovs_ns = ovs_daemons.netns
    assert ovs_ns is not None
    ns = {"w1": f"tfw{tok}{os.getpid() % 1000}a", "db1": f"tfw{tok}{os.getpid() % 1000}b"}
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
        for w, addr, b, host in (("w1", "10.1.0.11", br["gpu1"], f"tf{tok}h1"),
                                 ("db1", "10.1.0.21", br["gpu2"], f"tf{tok}h2")):
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
        ovs_daemons.add_port(br["gpu1"], f"tf{tok}x1", internal=True)  # b1's port on gpu1, unused here
        compiled, _ = compile_small()
        OvsBackend(ovs_daemons, br["gpu1"], {"p0": f"tf{tok}ua", "pf0vf0": f"tf{tok}h1", "pf0vf1": f"tf{tok}x1"}
                   ).apply(compiled.devices["nic:gpu1"])
        OvsBackend(ovs_daemons, br["gpu2"], {"p0": f"tf{tok}ub", "pf0vf0": f"tf{tok}h2"}
                   ).apply(compiled.devices["nic:gpu2"])
        for w in ns:
            proc = subprocess.Popen(["ip", "netns", "exec", ns[w], sys.executable, "-c", SERVER, "443", "5432"],
                                    stdout=subprocess.PIPE, text=True)
            servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield ns
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
