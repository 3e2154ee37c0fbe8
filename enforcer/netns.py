"""Run code inside a named network namespace (`/run/netns/<name>`, as `ip netns add` makes them).

A network namespace belongs to a thread, not to a process: `setns(2)` in a thread moves only that thread,
and sockets it opens (netlink for libnftables, TCP for a probe) stay in that namespace for their lifetime.
So `run_in` starts a short-lived thread, enters the namespace there and runs the function: the caller's
thread, and with it the root namespace's ruleset and links, is never touched. Python 3.11 has no
`os.setns`, hence libc through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OSError):
    """The namespace does not exist or cannot be entered."""


def netns_path(name: str) -> Path:
    if not name or "/" in name or name in (".", ".."):
        raise NetnsError(f"not a namespace name: {name!r}")
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return netns_path(name).exists()


def enter(name: str) -> None:
    """Move the calling thread into namespace `name`; only for threads made for it (see run_in)."""
    try:
        fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsError(f"network namespace {name}: {exc.strerror}") from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in(name: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a new thread inside namespace `name`; its result, or its exception re-raised here."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            enter(name)
            box["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name=f"netns:{name}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
