"""Watch one established TCP connection while rule sets change under it: is an allowed flow ever interrupted?

A rule change must be hitless for the flows it keeps allowing (DESIGN: atomic per device; OVN's users' lesson:
a controller that removes and reinstalls flows leaves traffic dark meanwhile). The watcher sends a numbered
message every INTERVAL over a connection opened inside a namespace and times each echo; the namespace's own
TCP counters (`/proc/net/snmp`, read inside it) tell whether any segment had to be sent again. A lost packet
always shows as a retransmission; a slow machine only as a longer gap, so the gap bound is loose and the
retransmission count is exact.
"""

from __future__ import annotations

import itertools
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

INTERVAL = 0.01
MESSAGE = struct.Struct("!Q")

# An echo server for `ip netns exec <ns> python -c ECHO_SERVER <port>...`: IPv4 and IPv6 on each port (one
# dual-stack socket, or IPv4 alone where the namespace has no IPv6); prints "ready" once listening.
ECHO_SERVER = (
    "import socket,sys,threading\n"
    "def echo(c):\n"
    "    with c:\n"
    "        while True:\n"
    "            b=c.recv(65536)\n"
    "            if not b: return\n"
    "            c.sendall(b)\n"
    "def listener(p):\n"
    "    try:\n"
    "        s=socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,0)\n"
    "        s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(('::',p))\n"
    "    except OSError:\n"
    "        s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(('0.0.0.0',p))\n"
    "    s.listen(); return s\n"
    "def serve(s):\n"
    "    while True:\n"
    "        c,_=s.accept(); threading.Thread(target=echo,args=(c,),daemon=True).start()\n"
    "for s in [listener(int(p)) for p in sys.argv[1:]]:\n"
    "    threading.Thread(target=serve,args=(s,),daemon=True).start()\n"
    "print('ready',flush=True); threading.Event().wait()\n"
)


@contextmanager
def echo_server(netns: str, *ports: int) -> Iterator[None]:
    """ECHO_SERVER on `ports` inside `netns` for the block (listening before it starts, killed after)."""
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", ECHO_SERVER, *map(str, ports)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", f"echo server in {netns}"
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


def connect_from(src: str, dst: str, port: int, within: float = 10.0) -> socket.socket:
    """A TCP connection from address `src` to `dst`:`port`, tried again until `within` seconds have passed (the first
    ARP exchange and the userspace datapath's first upcalls take a moment on a loaded machine). Call it inside the
    source's namespace (enforcer.netns.run_in): the socket stays there."""
    deadline = time.monotonic() + within
    while True:
        s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
        try:
            s.bind((src, 0))
            s.settimeout(1.5)
            s.connect((dst, port))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def retransmitted_segments(netns: str) -> int:
    """TCP segments the namespace's kernel has sent again since it was made (RFC 1213 tcpRetransSegs)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/snmp"], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    names, values = [line.split() for line in out.splitlines() if line.startswith("Tcp:")][:2]
    return int(dict(zip(names, values, strict=True))["RetransSegs"])


@dataclass
class Watch:
    """What the watcher saw: echo times (monotonic), how many were sent, and the error that ended it, if any."""

    sent: int = 0
    echoed: list[float] = field(default_factory=list)
    error: str | None = None
    started: float = 0.0
    stopped: float = 0.0

    def max_gap(self) -> float:
        """The longest time without an echo, from the start to the stop."""
        times = [self.started, *self.echoed, self.stopped]
        return max(b - a for a, b in itertools.pairwise(times))

    def gaps_over(self, seconds: float) -> list[tuple[float, float]]:
        """(start, length) of each silence longer than `seconds`, relative to the start: for a failure message."""
        times = [self.started, *self.echoed, self.stopped]
        return [(round(a - self.started, 3), round(b - a, 3)) for a, b in itertools.pairwise(times)
                if b - a > seconds]


class FlowWatcher:
    """Echoes over `sock` (already connected, to an echo server) from two threads until stop()."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.watch = Watch()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True),
                         threading.Thread(target=self._receive, daemon=True)]

    def __enter__(self) -> FlowWatcher:
        self.sock.settimeout(5.0)
        self.watch.started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Watch:
        if not self._stop.is_set():
            self._stop.set()
            self._threads[0].join(timeout=10)
            deadline = time.monotonic() + 5  # the last messages' echoes are still on the way
            while len(self.watch.echoed) < self.watch.sent and time.monotonic() < deadline \
                    and self.watch.error is None:
                time.sleep(INTERVAL)
            self.watch.stopped = time.monotonic()
            self.sock.close()
            self._threads[1].join(timeout=10)
        return self.watch

    def _send(self) -> None:
        n = 0
        while not self._stop.wait(INTERVAL):
            try:
                self.sock.sendall(MESSAGE.pack(n))
            except OSError as exc:
                self.watch.error = self.watch.error or f"send: {exc}"
                return
            n += 1
            self.watch.sent = n

    def _receive(self) -> None:
        buf = b""
        expected = 0
        while True:
            try:
                chunk = self.sock.recv(4096)
            except OSError as exc:
                if not self._stop.is_set():
                    self.watch.error = self.watch.error or f"receive: {exc}"
                return
            if not chunk:
                if not self._stop.is_set():
                    self.watch.error = self.watch.error or "the connection was closed"
                return
            buf += chunk
            now = time.monotonic()
            while len(buf) >= MESSAGE.size:
                (n,) = MESSAGE.unpack(buf[: MESSAGE.size])
                buf = buf[MESSAGE.size:]
                if n != expected:
                    self.watch.error = self.watch.error or f"echo {n} arrived where {expected} was due"
                    return
                expected += 1
                self.watch.echoed.append(now)
