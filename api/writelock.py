"""Serialize this server's grant writers across its worker processes (SQLite only).

SQLite has one writer at a time; a writer that finds the lock taken sleeps in growing steps (up to
100 ms) and retries, which is what made the tail latency of concurrent grant requests. Queueing on a
kernel file lock first (and on a thread lock inside a process) wakes the next writer as soon as the
previous one is done. PostgreSQL needs nothing of the kind: row locks and compare-and-set do it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from workflows.context import AppContext

_thread_lock = threading.Lock()
_fds: dict[str, int] = {}


def _fd(path: Path) -> int:
    key = str(path)
    fd = _fds.get(key)
    if fd is None:
        fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o600)
        _fds[key] = fd
    return fd


@contextlib.contextmanager
def grant_writer(ctx: AppContext) -> Iterator[None]:
    if ctx.db.dialect != "sqlite":
        yield
        return
    with _thread_lock:
        fd = _fd(ctx.settings.home / ".grant-writes.lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
