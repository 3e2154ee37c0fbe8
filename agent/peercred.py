"""Who is calling the Workload API: the kernel's word for it, and the selectors that caller matches.

gRPC's Python server does not expose a unix socket's peer credentials (its `peer()` for a unix socket names
only the path, and it cannot adopt a socket we accepted). So the agent accepts on the Workload API socket
itself, reads SO_PEERCRED (pid, uid, gid: set by the kernel at connect, unforgeable by the caller), and
relays the connection's bytes to the gRPC server on a loopback port, recording the relay's own source port
against those credentials. The servicer maps `context.peer()` (`ipv4:127.0.0.1:<port>`) back to them. A
process that connects to the loopback port directly has no entry and gets nothing (fail closed); an entry
lives exactly as long as its relayed connection.

Selectors (pki.selectors, SPIRE's unix attestor): `unix:uid:N`, `unix:gid:N`, `unix:user:NAME`,
`unix:group:NAME` (the primary group), `unix:path:/abs/exe` and `unix:sha256:HEX` (the executable, read
through /proc/<pid>/exe). A placement with no selector matches no one.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import pwd
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("trustfabric.agent.peercred")

_UCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    _cache: dict[str, str | None] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def _exe(self) -> str | None:
        if "path" not in self._cache:
            try:
                self._cache["path"] = os.readlink(f"/proc/{self.pid}/exe")
            except OSError:
                self._cache["path"] = None
        return self._cache["path"]

    def value(self, key: str) -> str | None:
        """The caller's value for a unix selector key (None: unknown, which matches nothing)."""
        if key == "uid":
            return str(self.uid)
        if key == "gid":
            return str(self.gid)
        if key == "user":
            with contextlib.suppress(KeyError):
                return pwd.getpwuid(self.uid).pw_name
            return None
        if key == "group":
            with contextlib.suppress(KeyError):
                return grp.getgrgid(self.gid).gr_name
            return None
        if key == "path":
            return self._exe()
        if key == "sha256":
            if "sha256" not in self._cache:
                try:
                    # the pid's own view of its executable, even if the path was replaced since
                    self._cache["sha256"] = hashlib.sha256(Path(f"/proc/{self.pid}/exe").read_bytes()).hexdigest()
                except OSError:
                    self._cache["sha256"] = None
            return self._cache["sha256"]
        return None

    def matches(self, selectors: Iterable[str]) -> bool:
        """True when the caller matches every selector (and there is at least one)."""
        wanted = list(selectors)
        if not wanted:
            return False
        for sel in wanted:
            kind, _, rest = sel.partition(":")
            key, _, value = rest.partition(":")
            if kind != "unix" or self.value(key) != value:
                return False
        return True


def peer_credentials(sock: socket.socket) -> Caller:
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Caller(pid, uid, gid)


class PeerCredRelay:
    """Accepts on a unix socket, relays each connection to `target` (loopback), remembers who is behind it."""

    def __init__(self, path: Path, target_port: int) -> None:
        self.path = Path(path)
        self.target_port = target_port
        self._callers: dict[str, Caller] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        os.chmod(self.path, 0o777)  # noqa: S103 -- every local process may ask; what it gets depends on who it is
        self._listener.listen(128)
        self._thread = threading.Thread(target=self._accept_forever, name="workload-api-accept", daemon=True)
        self._thread.start()

    def caller(self, peer: str) -> Caller | None:
        """The credentials behind a relayed connection, by the gRPC peer string; None for anything else."""
        with self._lock:
            return self._callers.get(peer)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept_forever(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            try:
                caller = peer_credentials(conn)
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                log.warning("workload API: cannot relay a connection: %s", exc)
                conn.close()
                continue
            host, port = upstream.getsockname()[:2]
            key = f"ipv4:{host}:{port}"
            with self._lock:
                self._callers[key] = caller  # before a byte is relayed: the first RPC finds it
                self._conns |= {conn, upstream}
            threading.Thread(target=self._pump_pair, args=(conn, upstream, key), daemon=True,
                             name=f"workload-api-relay-{caller.pid}").start()

    def _pump_pair(self, conn: socket.socket, upstream: socket.socket, key: str) -> None:
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        with self._lock:
            self._callers.pop(key, None)
            self._conns -= {conn, upstream}
        conn.close()
        upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
