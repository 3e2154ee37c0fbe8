"""`lab probe SRC DST PORT`: a real TCP connection through the lab, and which rule decided.

A listener for PORT is opened on the destination workload's address in its node's namespace and a
connection is made from the source workload's address in its node's namespace (threads that entered the
namespaces: no process is started, so an answer takes milliseconds, a BLOCKED one the timeout). OPEN means
the handshake completed: the SYN crossed the source NIC, the leaf (or leaves, over the spine) and the
destination NIC, and the SYN-ACK came back the same way.

Which rule decided: the per-rule counters of the devices on the path (the NICs' flows by cookie, the
leaves' nftables rules by comment) are read before and after; the ones that moved name the policy rule or
grant that opened the path, or the deny that closed it. The enforcer's own walk of the applied rule sets
(enforcer.equivalence.Walker) gives its answer beside the wire's, and `agrees` says whether they match.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from enforcer.backends.base import RuleCounter
from enforcer.backends.ovs import SPOOFING
from enforcer.equivalence import Walker
from enforcer.fabric import Fabric
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from lab import netops
from lab.errors import LabError, LabInputError
from lab.standalone import Installed, backend

DEFAULT_TIMEOUT = 1.0


@dataclass(frozen=True)
class Endpoint:
    workload: str
    node: str
    netns: str
    ipv4: str | None
    ipv6: str | None

    def address(self, family: int) -> str:
        addr = self.ipv4 if family == 4 else self.ipv6
        if addr is None:
            raise LabInputError(f"{self.workload} has no IPv{family} address")
        return addr


def endpoint(st: dict[str, Any], key: str) -> Endpoint:
    w = st.get("workloads", {}).get(key)
    if w is None:
        known = ", ".join(sorted(st.get("workloads", {}))[:8])
        raise LabInputError(f"no workload {key!r} in the lab (tenant/group/name; the lab has: {known})")
    return Endpoint(key, w["node"], w["netns"], w["ipv4"], w["ipv6"])


# ---------------------------------------------------------------------- sockets inside namespaces

def _listen(addr: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((addr, port))
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            return None  # something already listens there: the probe connects to it
        raise
    s.listen(1024)
    return s


def _connect(src: str, dst: str, port: int, timeout: float) -> tuple[bool, float]:
    s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((src, 0))
        s.settimeout(timeout)
        start = time.perf_counter()
        try:
            s.connect((dst, port))
            ok = True
        except (TimeoutError, ConnectionRefusedError, OSError) as exc:
            if not isinstance(exc, TimeoutError | ConnectionRefusedError) and exc.errno not in (
                    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET):
                raise
            ok = False
        return ok, time.perf_counter() - start
    finally:
        s.close()


@contextmanager
def listening(items: Sequence[tuple[Endpoint, int, int]]) -> Iterator[None]:
    """Listeners on (endpoint, family, port) for the duration of the block."""
    socks: list[socket.socket] = []
    try:
        for ep, family, port in sorted(set(items), key=lambda x: (x[0].workload, x[1], x[2])):
            s = run_in(ep.netns, _listen, ep.address(family), port)
            if s is not None:
                socks.append(s)
        yield
    finally:
        for s in socks:
            s.close()


def connect(src: Endpoint, dst: Endpoint, port: int, family: int = 4, timeout: float = DEFAULT_TIMEOUT
            ) -> tuple[bool, float]:
    """(handshake completed, seconds) from src's address to dst's (a listener must be open)."""
    return run_in(src.netns, _connect, src.address(family), dst.address(family), port, timeout)


def connect_many(items: Sequence[tuple[Endpoint, Endpoint, int, int]], timeout: float = DEFAULT_TIMEOUT,
                 workers: int = 64) -> list[bool]:
    """Many connections at once (src, dst, port, family), each answer in order: the matrix takes about one
    timeout per `workers` blocked connections, not one per connection."""
    tasks = [partial(connect, s, d, port, fam, timeout) for s, d, port, fam in items]
    return [ok for ok, _ in netops.parallel(tasks, workers=workers)]


# ---------------------------------------------------------------------- a probe with its explanation

@dataclass
class ProbeResult:
    src: str
    dst: str
    port: int
    family: int
    open: bool
    seconds: float
    enforcer_allows: bool | None  # None: no rule sets recorded (agent mode: the agents hold them)
    enforcer_detail: str
    decided_by: list[str] = field(default_factory=list)
    moved: list[dict[str, Any]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # why the applied rule sets lag the file (see operations.stale)

    @property
    def agrees(self) -> bool | None:
        return None if self.enforcer_allows is None else self.open == self.enforcer_allows

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "proto": "tcp", "port": self.port, "family": self.family,
                "result": "OPEN" if self.open else "BLOCKED", "seconds": round(self.seconds, 4),
                "decided_by": self.decided_by, "counters_moved": self.moved,
                "enforcer": {"allows": self.enforcer_allows, "detail": self.enforcer_detail},
                "agrees": self.agrees, "stale": self.stale}


Snapshot = dict[tuple[str, str, tuple[str, ...], str], int]


def _snapshot(st: dict[str, Any], inst: Installed, devices: Sequence[str]) -> Snapshot:
    def read(device: str) -> list[RuleCounter]:
        return backend(st, device, inst.fabric).counters(inst.devices[device])

    if any(d.startswith("nic:") for d in devices):
        OvsDaemons(Path(st["ovs"]["rundir"])).push_stats()
    out: Snapshot = {}
    for device, counters in zip(devices, netops.parallel([partial(read, d) for d in devices]), strict=True):
        for c in counters:
            key = (device, c.where, c.reasons, c.action)
            out[key] = out.get(key, 0) + c.packets
    return out


def probe(st: dict[str, Any], inst: Installed, src_key: str, dst_key: str, port: int, family: int = 4,
          timeout: float = DEFAULT_TIMEOUT) -> ProbeResult:
    if not 1 <= port <= 65535:
        raise LabInputError(f"port {port} is not 1-65535")
    if src_key == dst_key:
        raise LabInputError("source and destination are the same workload")
    src, dst = endpoint(st, src_key), endpoint(st, dst_key)
    fabric = inst.fabric
    s_pl, d_pl = fabric.placement[src_key], fabric.placement[dst_key]
    path = _path(fabric, src.node, dst.node)
    known = all(d in inst.devices for d in path)
    allows: bool | None = None
    detail = "no rule sets recorded for this path (agent mode: the node agents hold them)"
    if known:
        allows, detail = Walker(inst).walk(s_pl, d_pl, family, "tcp", port)
    before = _snapshot(st, inst, path) if known else {}
    with listening([(dst, family, port)]):
        ok, seconds = connect(src, dst, port, family, timeout)
    after = _snapshot(st, inst, path) if known else {}
    moved = [(k, after[k] - before.get(k, 0)) for k in after if after[k] > before.get(k, 0)]
    moved.sort(key=lambda kv: (path.index(kv[0][0]), kv[0][1]))
    result = ProbeResult(src_key, dst_key, port, family, ok, seconds, allows, detail, moved=[
        {"device": k[0], "where": k[1], "reasons": list(k[2]), "action": k[3], "packets": n} for k, n in moved])
    result.decided_by = _decided_by(ok, moved, detail) if known else [f"counters not read: {detail}"]
    return result


def _path(fabric: Fabric, src_node: str, dst_node: str) -> list[str]:
    att = fabric.attachment
    if src_node not in att or dst_node not in att:
        raise LabError("a node of this pair is not cabled to a leaf")
    return list(dict.fromkeys([f"nic:{src_node}", f"leaf:{att[src_node].leaf}", f"leaf:{att[dst_node].leaf}",
                               f"nic:{dst_node}"]))


def _decided_by(ok: bool, moved: list[tuple[tuple[str, str, tuple[str, ...], str], int]], detail: str) -> list[str]:
    """The rules that counted the probe's packets. A blocked probe: the first deny on the path that counted,
    the anti-spoofing drop only when no other deny did. The probe sends from the workload's own address, so
    that drop counts its packets only when the NIC does not know the address; it also counts what the
    interfaces send by themselves from no workload address in their first seconds (IPv6 start-up traffic:
    three packets in the first two seconds after `lab up` here), and it comes first on the path (table 0),
    so taken first it named that traffic instead of the rule that refused the connection."""
    if ok:
        opened = sorted({r for (_, _, rs, action), _ in moved if action == "allow" for r in rs}
                        - {"conntrack-return"})
        return opened or ["conntrack-return"]
    denies = sorted(((device, where, why) for (device, where, why, action), _ in moved if action == "deny"),
                    key=lambda d: d[2] == SPOOFING)  # a stable sort: path order otherwise
    if denies:
        device, where, why = denies[0]
        return [f"{device} {where}: deny ({', '.join(why)})"]
    return [f"no deny rule counted the packets; the enforcer says: {detail}"]
