"""The few host operations the lab runs: `ip`/`bridge` batches, sysctls and checksum offload inside a
namespace (a thread that entered it: enforcer.netns), namespaces found by prefix, processes ended by pid."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from enforcer.netns import NETNS_DIR
from lab.errors import LabError

T = TypeVar("T")
SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17  # set TX checksum offload (the kernel drops the offloads depending on it too)


def run(args: Sequence[str], input: str | None = None, timeout: float = 60) -> str:
    """Run a tool; LabError with its first error line when it fails."""
    try:
        proc = subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LabError(f"{args[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(args[:4])} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise LabError(f"{' '.join(args[:4])} failed: {' | '.join(detail[:3])[:400]}")
    return proc.stdout


def ip_batch(lines: Iterable[str], netns: str | None = None, family6: bool = False) -> None:
    text = "".join(line + "\n" for line in lines)
    if text:
        run(["ip", *(["-n", netns] if netns else []), *(["-6"] if family6 else []), "-batch", "-"], input=text)


def bridge_batch(lines: Iterable[str], netns: str) -> None:
    text = "".join(line + "\n" for line in lines)
    if text:
        run(["bridge", "-n", netns, "-batch", "-"], input=text)


def write_sysctls(pairs: Iterable[tuple[str, str]]) -> None:
    """Inside a namespace's thread: /proc/sys/net resolves against the calling thread's namespace."""
    for path, value in pairs:
        with open(f"/proc/sys/{path}", "w") as f:
            f.write(value)


def tx_checksum_off(ifnames: Iterable[str]) -> None:
    """`ethtool -K <if> tx off` for each interface, inside a namespace's thread (SIOCETHTOOL)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in ifnames:
            value = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_STXCSUM, 0))
            ifreq = struct.pack("16sP", name.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            try:
                fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
            except OSError as exc:
                raise LabError(f"cannot turn off TX checksum offload on {name}: {exc.strerror}") from None


def parallel(tasks: Sequence[Callable[[], T]], workers: int = 16) -> list[T]:
    """Run the tasks on a pool; every task finishes, then the first error (in task order) is raised."""
    if not tasks:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        futures = [pool.submit(t) for t in tasks]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]


def namespaces_with_prefix(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def pids_in_netns(name: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
    return [int(x) for x in proc.stdout.split() if x.isdigit()]


def end_processes(pids: Iterable[int], grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after `grace` seconds (0: SIGKILL at once)."""
    alive = []
    for pid in set(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            alive.append(pid)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.02)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie of ours: reap it
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True
