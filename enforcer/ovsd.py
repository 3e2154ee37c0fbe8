"""Private Open vSwitch daemons: ovsdb-server + ovs-vswitchd in a run directory of their own.

Never the system's OVS: every command runs with OVS_RUNDIR / OVS_LOGDIR / OVS_DBDIR set to `rundir`, and
the database socket is `<rundir>/db.sock`. Bridges use the userspace datapath (`datapath_type=netdev`),
which is what works on this kernel. The lab hosts one bridge per GPU node on one pair of daemons, started
inside a network namespace of its own (`netns`: the userspace datapath's tap devices then live there, not
in the root namespace); tests start their own and stop them in a finally. `stop()` kills only the pids
this object started. An object made for a running pair (same rundir, never started) drives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from enforcer.errors import ApplyError

SCHEMA_CANDIDATES = ("/usr/share/openvswitch/vswitch.ovsschema",)


def ovs_available() -> str | None:
    """None when OVS can run here, else why not (for a test's skip reason)."""
    for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovsdb-tool"):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian package openvswitch-switch)"
    if not any(Path(p).exists() for p in SCHEMA_CANDIDATES):
        return "vswitch.ovsschema not found (Debian package openvswitch-common)"
    if os.geteuid() != 0:
        return "ovs-vswitchd needs root for its datapath and tap devices"
    return None


class OvsDaemons:
    """One ovsdb-server and one ovs-vswitchd confined to `rundir`."""

    def __init__(self, rundir: Path, netns: str | None = None) -> None:
        self.rundir = Path(rundir)
        self.netns = netns
        self._launch = ["ip", "netns", "exec", netns] if netns else []
        self.env = {**os.environ, "OVS_RUNDIR": str(self.rundir), "OVS_LOGDIR": str(self.rundir),
                    "OVS_DBDIR": str(self.rundir), "OVS_SYSCONFDIR": str(self.rundir)}
        self.db_sock = self.rundir / "db.sock"
        self._pids: list[int] = []
        self._taps: list[str] = []  # internal ports: the userspace datapath makes them tap devices

    def run(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, input=input, timeout=60)
        if check and proc.returncode != 0:
            raise ApplyError(f"{' '.join(args[:3])} failed: {proc.stderr.strip()[:500]}")
        return proc

    def vsctl(self, *args: str) -> str:
        return self.run("ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=30", *args).stdout

    def start(self) -> OvsDaemons:
        self.rundir.mkdir(parents=True, exist_ok=True)
        schema = next(p for p in SCHEMA_CANDIDATES if Path(p).exists())
        db = self.rundir / "conf.db"
        self.run("ovsdb-tool", "create", str(db), schema)
        self.run(*self._launch, "ovsdb-server", str(db), f"--remote=punix:{self.db_sock}",
                 f"--pidfile={self.rundir}/ovsdb.pid", "--detach", f"--log-file={self.rundir}/ovsdb.log",
                 f"--unixctl={self.rundir}/ovsdb.ctl")
        self._pids.append(self._pid("ovsdb.pid"))
        self.vsctl("--no-wait", "init")
        self.run(*self._launch, "ovs-vswitchd", f"unix:{self.db_sock}", f"--pidfile={self.rundir}/vswitchd.pid",
                 "--detach", f"--log-file={self.rundir}/vswitchd.log", f"--unixctl={self.rundir}/vswitchd.ctl")
        self._pids.append(self._pid("vswitchd.pid"))
        return self

    def _pid(self, name: str) -> int:
        path = self.rundir / name
        for _ in range(100):
            if path.exists() and path.read_text().strip():
                return int(path.read_text().strip())
            time.sleep(0.05)
        raise ApplyError(f"OVS daemon did not write {path}")

    def add_bridge(self, name: str) -> None:
        self.vsctl("add-br", name, "--", "set", "bridge", name, "datapath_type=netdev",
                   "protocols=OpenFlow13", "fail_mode=secure")
        self._taps.append(name)

    def del_bridge(self, name: str) -> None:
        self.vsctl("--if-exists", "del-br", name)

    def add_port(self, bridge: str, port: str, internal: bool = False) -> None:
        extra = ["--", "set", "interface", port, "type=internal"] if internal else []
        self.vsctl("add-port", bridge, port, *extra)
        if internal:
            self._taps.append(port)

    def push_stats(self) -> None:
        """Wait for one revalidator round: packets that hit the datapath's flow cache reach the OpenFlow
        flows' counters only then (every `other_config:max-revalidator` ms, 500 by default)."""
        self.run("ovs-appctl", "-t", f"{self.rundir}/vswitchd.ctl", "revalidator/wait")

    def unixctl(self) -> Unixctl:
        """One connection to ovs-vswitchd's control socket, for many `ovs-appctl` commands in a row."""
        return Unixctl(self.rundir / "vswitchd.ctl")

    def mgmt(self, bridge: str) -> str:
        """The OpenFlow management socket ovs-ofctl talks to for `bridge`."""
        return f"unix:{self.rundir}/{bridge}.mgmt"

    def stop(self) -> None:
        """Stop the daemons (removing their datapath ports) and delete any tap device they left behind."""
        if self._pids:
            self.run("ovs-appctl", "-t", f"{self.rundir}/vswitchd.ctl", "exit", "--cleanup", check=False)
        alive = []
        for pid in reversed(self._pids):  # each takes ~2 s to exit on SIGTERM: signal both, then wait for both
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                alive.append(pid)
        deadline = time.monotonic() + 5
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _running(pid)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._pids.clear()
        for tap in self._taps:
            if self.netns is not None:  # the namespace's owner deletes it, and its taps with it
                break
            if Path(f"/sys/class/net/{tap}").exists():
                subprocess.run(["ip", "link", "del", tap], capture_output=True, timeout=30)
        self._taps.clear()


class UnixctlError(Exception):
    """The daemon answered a command with an error (its text is the message)."""


class Unixctl:
    """`ovs-appctl` without a process per command: the JSON-RPC requests it would send, one after the other on one
    connection to the daemon's control socket (an ovs-appctl process costs ~5 ms; a request on an open connection a
    few tens of microseconds, which is what bounds cutting thousands of conntrack entries in one apply). A failure to
    connect or talk is ApplyError; an error answer is UnixctlError."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.path, self.timeout = path, timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._decoder = json.JSONDecoder()
        self._id = 0

    def __enter__(self) -> Unixctl:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError as exc:
            sock.close()
            raise ApplyError(f"cannot reach ovs-vswitchd at {self.path}: {exc.strerror or exc}") from None
        self._sock = sock
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __call__(self, method: str, *params: str) -> str:
        """The command's output; UnixctlError with the daemon's message when it refuses it."""
        if self._sock is None:
            raise ApplyError("unixctl used outside its with block")
        self._id += 1
        try:
            self._sock.sendall(json.dumps({"id": self._id, "method": method, "params": list(params)}).encode())
            while True:
                reply = self._next()
                if reply is not None:
                    break
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    raise ApplyError(f"ovs-vswitchd closed {self.path} during {method}")
                self._buf += chunk
        except OSError as exc:
            raise ApplyError(f"ovs-vswitchd at {self.path}, {method}: {exc.strerror or exc}") from None
        if reply.get("error") is not None:
            raise UnixctlError(str(reply["error"]).strip())
        return str(reply.get("result") or "")

    def _next(self) -> dict[str, object] | None:
        """The next whole JSON object received, or None until one has arrived."""
        raw = self._buf.lstrip()
        if not raw:
            return None
        try:
            text = raw.decode()
            obj, end = self._decoder.raw_decode(text)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None  # not all of it yet
        self._buf = text[end:].encode()
        return obj if isinstance(obj, dict) else {}


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
