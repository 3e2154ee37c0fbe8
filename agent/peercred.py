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

The executable is pinned at accept, not read when a request is answered. The kernel fixes the pid at connect,
but not what that pid runs: a process could connect, fork a child that keeps the connection, and exec the
binary a placement names; read at request time, /proc/<pid>/exe would then vouch for the child's requests.
So at accept the relay takes a pidfd for the peer (SO_PEERPIDFD, Linux 6.5+: the very process that connected;
else pidfd_open right after SO_PEERCRED) and records the executable's identity: its path and the (st_dev,
st_ino) /proc/<pid>/exe leads to, read while the pidfd shows the process alive (so the pid was not reused).
A path or sha256 selector then matches only while that process is alive and still runs that same file (same
inode: a binary replaced on disk under a running process does not change what it runs), against the path and
hash of the file as it was at accept; an
exec since accept, an exit, or anything unreadable matches nothing (fail closed, one WARNING line). The
sha256 is of the file identified at accept (opened through /proc/<pid>/exe and hashed only if it is that
inode), computed at the first request that needs it. uid/gid/user/group are the kernel's connect-time values.

A path selector also needs the path, as the agent itself sees it at accept, to lead to that very file: the kernel
writes /proc/<pid>/exe in the caller's own mount namespace, where any user (`unshare -Urm`) can bind-mount a binary of
its own over a placement's path, and a container's image has files of the same names. Such a caller, and one whose
binary was replaced on disk before it connected ("<path> (deleted)"), matches no path selector; sha256 selectors
(the content) still match.

/proc is read at the caller's number in /proc's own pid namespace, as the kernel gives it for the pidfd (its
fdinfo), not at SO_PEERCRED's pid, which is in the agent's pid namespace: the two differ when the agent's /proc is
another namespace's, and /proc/<SO_PEERCRED pid> is then another process (a caller /proc cannot see matches nothing).

The honest limit: an exec between the caller's connect and the relay's accept is not seen (the kernel keeps no
exec count or exec time to compare with the connect). The window is not only the relay's own latency: a caller
can queue connections ahead of its own in the listen backlog (128), and the relay accepts them one at a time
(measured here: 1.4 ms alone, 92 ms behind 127 queued ones), time enough to exec. The exec'd binary's own code runs
from then on, but a caller that wins (a child it forked keeps the connection) is taken for the binary it exec'd: a
path or sha256 selector is no boundary against code running as the same uid (which can also ptrace that binary
where Yama allows), only alongside a uid the attacker does not have. On a
kernel without SO_PEERPIDFD, the pid could in principle also be reused between connect and pidfd_open (the
caller must exit and its pid number come round again in that window).
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import pwd
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

log = logging.getLogger("trustfabric.agent.peercred")

_UCRED = struct.Struct("3i")
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5+; Python 3.11 has no name for it
_EXE_KEYS = frozenset({"path", "sha256"})


@dataclass(frozen=True)
class ExeIdentity:
    """The file a process runs: the path /proc/<pid>/exe names and the inode it leads to. `here`: that path, looked up
    in the agent's own view of the filesystem at accept, is that very file (only then does a path selector match)."""

    path: str
    dev: int
    ino: int
    here: bool = False


class PeerProcess:
    """A pidfd for the process behind a connection: tells whether that very process still runs (a pid number
    can be reused once its process is gone; a pidfd cannot). Closed with its connection."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._fd = pidfd
        self._lock = threading.Lock()  # a poll never races a close into someone else's reused fd number

    def alive(self) -> bool:
        """True while the process has not exited; False once it has, or once this handle is closed."""
        with self._lock:
            if self._fd < 0:
                return False
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            return not poller.poll(0)  # a pidfd polls readable when its process exits

    def proc_pid(self) -> int | None:
        """The process's number in the pid namespace of the agent's /proc, or None (exited, or not in that namespace).
        SO_PEERCRED's pid is in the agent's own pid namespace, which need not be its /proc's (an agent started with
        `unshare --pid --fork` and the host's /proc, a container given another namespace's /proc): /proc/<that pid>
        is then some other process, and its executable was taken for the caller's. The kernel's fdinfo for the pidfd
        gives the number in the namespace of the /proc it is read through."""
        with self._lock:
            if self._fd < 0:
                return None
            try:
                info = os.open(f"/proc/self/fdinfo/{self._fd}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    text = os.read(info, 4096)
                finally:
                    os.close(info)
                start = text.index(b"\nPid:") + 5
                number = int(text[start:text.index(b"\n", start)])
            except (OSError, ValueError):
                return None
        return number if number > 0 else None  # 0: not in that namespace; -1: exited

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def exe_identity(pid: int) -> ExeIdentity | None:
    """What /proc/<pid>/exe names and leads to now; None if unreadable or changing under us (an exec between the
    reads). The caller checks afterwards that the pid is still its process."""
    exe = f"/proc/{pid}/exe"
    try:
        path = os.readlink(exe)
        st = os.stat(exe)  # follows the magic link to the mapped binary, even if its path was replaced since
        again = os.readlink(exe)
    except OSError:
        return None
    return ExeIdentity(path, st.st_dev, st.st_ino) if again == path else None


@dataclass(frozen=True)
class Caller:
    """The kernel's credentials for a connection, and (when accepted by the relay) the process behind it with
    the executable it ran at accept. Without both, path and sha256 selectors match nothing."""

    pid: int
    uid: int
    gid: int
    process: PeerProcess | None = field(default=None, compare=False, hash=False, repr=False)
    exe: ExeIdentity | None = field(default=None, compare=False, hash=False)
    _cache: dict[str, str | None] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def _exe_still(self) -> ExeIdentity | None:
        """The executable recorded at accept, if the process that connected still runs it; else None (logged
        once per caller: an exec since accept, an exit, or a pid no longer ours)."""
        if self.exe is None or self.process is None:
            return None
        number = self.process.proc_pid()
        now = exe_identity(number) if number is not None else None
        alive = self.process.alive()  # after the read: if still alive, the read was of this process
        # the same file, by inode: its path may read "<path> (deleted)" since (the binary upgraded on disk under a
        # running process, which still runs what it connected with); the selector is matched against the path
        # recorded at accept
        if alive and now is not None and (now.dev, now.ino) == (self.exe.dev, self.exe.ino):
            return self.exe
        if "warned" not in self._cache:
            self._cache["warned"] = "1"
            log.warning("workload API: caller pid %d no longer runs the executable it connected with "
                        "(%s at accept, %s now): path and sha256 selectors match nothing", self.pid, self.exe.path,
                        "exited" if not alive else "unreadable" if now is None else now.path)
        return None

    def _sha256(self, exe: ExeIdentity) -> str | None:
        """The SHA-256 of the binary identified at accept: opened through /proc/<pid>/exe, hashed only if the
        opened file is that inode. Computed once."""
        if "sha256" not in self._cache:
            digest: str | None = None
            number = self.process.proc_pid() if self.process is not None else None
            try:
                if number is None:
                    raise FileNotFoundError("the caller is not in /proc")
                with open(f"/proc/{number}/exe", "rb") as f:
                    st = os.fstat(f.fileno())
                    if (st.st_dev, st.st_ino) == (exe.dev, exe.ino):
                        digest = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError:
                pass
            if digest is None:
                return None  # not cached: a later request after a transient failure may still succeed
            self._cache["sha256"] = digest
        return self._cache["sha256"]

    def value(self, key: str, exe: ExeIdentity | None = None) -> str | None:
        """The caller's value for a unix selector key (None: unknown, which matches nothing). For path and
        sha256, `exe` is the identity already confirmed by this request (else it is confirmed here)."""
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
        if key in _EXE_KEYS:
            exe = exe or self._exe_still()
            if exe is None:
                return None
            if key == "path":
                return exe.path if exe.here else None
            return self._sha256(exe)
        return None

    def matches(self, selectors: Iterable[str]) -> bool:
        """True when the caller matches every selector (and there is at least one). The executable is confirmed
        once per call, after the kernel's values matched."""
        return self._matches(selectors, self._exe_still)

    def matcher(self) -> Callable[[Iterable[str]], bool]:
        """`matches` for one request over many placements: the executable is confirmed once (at the first placement
        that names one), not once per placement (about 10 us each: a request over 1,000 placements spent 10 ms, and
        every open stream repeats it each second)."""
        confirmed: list[ExeIdentity | None] = []

        def exe() -> ExeIdentity | None:
            if not confirmed:
                confirmed.append(self._exe_still())
            return confirmed[0]

        return lambda selectors: self._matches(selectors, exe)

    def _matches(self, selectors: Iterable[str], confirm: Callable[[], ExeIdentity | None]) -> bool:
        wanted: list[tuple[str, str]] = []
        for sel in selectors:
            kind, _, rest = sel.partition(":")
            key, _, value = rest.partition(":")
            if kind != "unix":
                return False
            wanted.append((key, value))
        if not wanted:
            return False
        if not all(self.value(key) == value for key, value in wanted if key not in _EXE_KEYS):
            return False
        exe_wanted = [(key, value) for key, value in wanted if key in _EXE_KEYS]
        if not exe_wanted:
            return True
        exe = confirm()
        return exe is not None and all(self.value(key, exe) == value for key, value in exe_wanted)

    def close(self) -> None:
        """Release the pidfd (the connection is gone); path and sha256 selectors match nothing after."""
        if self.process is not None:
            self.process.close()


def peer_credentials(sock: socket.socket) -> Caller:
    """The kernel's credentials for a connected unix socket, with a pidfd for the process behind it and the
    executable that process runs now (None when either cannot be had: path/sha256 selectors then match nothing)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    process = _pidfd(sock, pid)
    number = process.proc_pid() if process is not None else None  # the pid in /proc's namespace (proc_pid)
    exe = exe_identity(number) if process is not None and number is not None else None
    if process is not None and exe is not None and not process.alive():
        exe = None  # gone: the pid read may have been someone else's
    if exe is not None:
        exe = replace(exe, here=_here(exe))
    return Caller(pid, uid, gid, process, exe)


def _here(exe: ExeIdentity) -> bool:
    """Whether the path /proc/<pid>/exe names leads, in the agent's own mount namespace and root, to the file the
    process runs. The kernel writes that path in the caller's view: a caller in a mount namespace of its own (any user
    can make one, `unshare -Urm`) bind-mounts its own binary over a placement's path and execs it there, and the
    link reads that path; so does a container running its own image's file of that name. Neither is the file the
    path names on this host: a path selector matches neither (sha256 is of the content, and still matches). Nor does
    it match a binary replaced on disk before the caller connected ("<path> (deleted)": where it was cannot be
    checked); a binary replaced after accept still matches (Caller._exe_still)."""
    try:
        st = os.stat(exe.path)
    except (OSError, ValueError):
        return False
    if (st.st_dev, st.st_ino) != (exe.dev, exe.ino):
        log.warning("workload API: the executable %r a caller runs is not the file at that path here (a mount "
                    "namespace or root of its own, or the file replaced): path selectors match nothing", exe.path)
        return False
    return True


def _pidfd(sock: socket.socket, pid: int) -> PeerProcess | None:
    try:
        return PeerProcess(pid, sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))  # the process that connected
    except OSError:
        pass  # an older kernel: the pid as it is now (it could have been reused since connect; see the docstring)
    try:
        return PeerProcess(pid, os.pidfd_open(pid))
    except OSError as exc:
        log.warning("workload API: no pidfd for caller pid %d (%s): path and sha256 selectors match nothing", pid, exc)
        return None


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
            caller: Caller | None = None
            try:
                caller = peer_credentials(conn)  # first, right at accept: the executable is pinned here
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                log.warning("workload API: cannot relay a connection: %s", exc)
                if caller is not None:
                    caller.close()
                conn.close()
                continue
            host, port = upstream.getsockname()[:2]
            key = f"ipv4:{host}:{port}"
            with self._lock:
                self._callers[key] = caller  # before a byte is relayed: the first RPC finds it
                self._conns |= {conn, upstream}
            try:
                threading.Thread(target=self._pump_pair, args=(conn, upstream, key), daemon=True,
                                 name=f"workload-api-relay-{caller.pid}").start()
            except RuntimeError as exc:  # no thread to be had (a flood of connections): this one is dropped, and
                # its pidfd and sockets with it; the relay goes on accepting (it used to die here, for every caller)
                log.warning("workload API: cannot relay a connection from pid %d: %s", caller.pid, exc)
                with self._lock:
                    self._callers.pop(key, None)
                    self._conns -= {conn, upstream}
                caller.close()
                conn.close()
                upstream.close()

    def _pump_pair(self, conn: socket.socket, upstream: socket.socket, key: str) -> None:
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        with self._lock:
            caller = self._callers.pop(key, None)
            self._conns -= {conn, upstream}
        if caller is not None:
            caller.close()
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
