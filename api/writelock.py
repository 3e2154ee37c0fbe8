"""Serialize this server's grant writers across its worker processes (SQLite only).

SQLite has one writer at a time; a writer that finds the lock taken sleeps in growing steps (up to
100 ms) and retries, which is what made the tail latency of concurrent grant requests. Queueing on a
kernel file lock first (and on a thread lock inside a process) wakes the next writer as soon as the
previous one is done. PostgreSQL needs nothing of the kind: row locks and compare-and-set do it.

The lock file is opened for each write and closed after it (an open and a close, microseconds beside
the write itself), so no file descriptor outlives its request.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

from workflows.context import AppContext

_thread_lock = threading.Lock()


@contextlib.contextmanager
def grant_writer(ctx: AppContext) -> Iterator[None]:
    if ctx.db.dialect != "sqlite":
        yield
        return
    with _thread_lock:
        fd = os.open(ctx.settings.home / ".grant-writes.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close
            yield
        finally:
            os.close(fd)
