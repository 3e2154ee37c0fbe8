"""Watch one established TCP connection while rule sets change under it: is an allowed flow ever interrupted?

A rule change must be hitless for the flows it keeps allowing (DESIGN: atomic per device; OVN's users' lesson:
a controller that removes and reinstalls flows leaves traffic dark meanwhile). The watcher sends a numbered
message every INTERVAL over a connection opened inside a namespace and times each echo; the connection's own
TCP counters, on both ends, tell whether any segment was lost (`lost`). A lost packet always
shows there; a slow machine shows as a longer gap or as a retransmission the receiver reports a duplicate, so the
gap bound is loose and the loss count exact.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from enforcer.netns import run_in

INTERVAL = 0.01
MESSAGE = struct.Struct("!Q")

def lost(sock: socket.socket) -> int:
    """Segments this connection had to send again because they were lost: its retransmissions (tcp_info
    tcpi_total_retrans) less those its peer reported as duplicates (D-SACK, RFC 2883: tcpi_dsack_dups). A
    retransmission can be spurious: a tail loss probe or a timeout fires when the peer is merely slow to answer (a
    loaded machine), and its data then arrives twice. Per connection, not per namespace: a namespace's counters
    also count other connections, such as a quarantined tenant's last packets, blocked on purpose."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    retrans = struct.unpack_from("I", info, 100)[0]
    dsack = struct.unpack_from("I", info, 216)[0] if len(info) >= 220 else 0
    return int(retrans - dsack)


def _listener(port: int) -> socket.socket:
    """IPv4 and IPv6 on `port` (one dual-stack socket, or IPv4 alone where the namespace has no IPv6)."""
    try:
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port))
    except OSError:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
    s.listen()
    s.settimeout(0.2)
    return s


class EchoServer:
    """Echoes every connection to `ports` inside `netns`, from threads of this process (the sockets were made in
    the namespace and stay there), so the connections' own counters can be read (`lost`)."""

    def __init__(self, netns: str, ports: tuple[int, ...]) -> None:
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._listeners = [run_in(netns, _listener, port) for port in ports]
        self._serving = [threading.Thread(target=self._serve, args=(listener,), daemon=True)
                         for listener in self._listeners]
        for thread in self._serving:
            thread.start()

    def lost(self) -> int:
        """Segments the server's side of its connections lost (read before close)."""
        return sum(lost(c) for c in list(self.accepted) if c.fileno() != -1)

    def close(self) -> None:
        """Stop and close; returns once the ports are free again (an accept in progress keeps its listening socket
        bound until its timeout: a new server on the same ports would find them in use)."""
        self._stop.set()
        for thread in self._serving:
            thread.join(timeout=2)
        for s in [*self._listeners, *self.accepted]:
            s.close()

    def _serve(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self.accepted.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            return


@contextmanager
def echo_server(netns: str, *ports: int) -> Iterator[EchoServer]:
    """An EchoServer on `ports` inside `netns` for the block (listening before it starts, closed after)."""
    server = EchoServer(netns, ports)
    try:
        yield server
    finally:
        server.close()


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


@dataclass
class Watch:
    """What the watcher saw: echo times (monotonic), how many were sent, and the error that ended it, if any."""

    sent: int = 0
    echoed: list[float] = field(default_factory=list)
    error: str | None = None
    lost: int = 0  # segments the watching side lost (`lost`), read when it stopped
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
            self.watch.lost = lost(self.sock)
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
