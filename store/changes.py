"""A change counter of the database shared by several processes: what lets a replica trust a cached read.

SQLite has one: `PRAGMA data_version` changes whenever any connection of any process commits (api/readcache.py
reads it). PostgreSQL has none, so `PostgresChanges` makes one per process: a thread on a connection of its
own reads the cluster's transaction snapshot (`pg_current_snapshot()`: its xmin, xmax and in-progress list
change whenever a transaction that wrote anything begins or ends, in any session of any replica) and adds
one to a local counter each time it differs from the last read. It reads it again every `poll` seconds
(50 ms); and every write transaction sends `NOTIFY trustfabric_changes` (store/db.py), which PostgreSQL
delivers once it committed: a notification moves the counter as it arrives, without a read (moving it more
often than needed only refuses cached values; a read per notification would cost every replica a round
trip per commit anywhere). So a commit on replica A moves the counter of replica B within the notification's
delivery (about a millisecond on one host), or within `poll` when a notification is lost or its writer sends
none; the snapshot, not the notification, is what makes the counter exact.

A value cached under counter value v was read after v was read, so the commit that ends v is after the
read began... or before it, in which case the value is fresher than needed; either way, once the counter
moves past v the entry is refused. Until the counter has been read once, and whenever the connection is
down, `version()` is None: nothing is cached or trusted (the caller reads the database, fail safe).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("trustfabric.store.changes")

CHANNEL = "trustfabric_changes"
_SNAPSHOT = "SELECT pg_current_snapshot()::text"


class PostgresChanges:
    """One per process and database: `version()` is an int that moves after every commit anywhere, or None."""

    def __init__(self, dsn: str, *, poll: float = 0.05) -> None:
        self._dsn = dsn
        self._poll = poll
        self._version: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.notifications = 0  # received (for tests: the fast path works)
        self._bumped = 0  # local bumps, kept apart from the listener's own count
        self._seen = 0  # snapshot changes the listener saw (and connections it lost)

    def version(self) -> int | None:
        if self._thread is None:
            self.start()
        return self._version

    def bump(self) -> None:
        """This process committed a write: move the counter now (its own next read must not be served from a
        value cached before the commit; the snapshot read will move it again, harmlessly)."""
        with self._lock:
            if self._version is not None:
                self._version += 1
                self._bumped += 1

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trustfabric-changes", daemon=True)
                self._thread.start()

    def halt(self) -> None:
        """Ask the thread to end (at its next poll), without waiting for it."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
                return
            except Exception as exc:  # the database went away: trust nothing until it is back
                with self._lock:
                    self._version = None
                    self._seen += 1  # the next value differs from every one handed out before
                log.warning("change feed lost its connection (%s); reconnecting in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            last = _read(conn)
            read_at = time.monotonic()
            self._move()
            while not self._stop.is_set():
                wait = max(0.0, read_at + self._poll - time.monotonic())
                # the generator runs until `wait` ends: each notification moves the counter as it arrives
                for _ in conn.notifies(timeout=wait, stop_after=64):
                    self.notifications += 1
                    self._move()
                if time.monotonic() - read_at >= self._poll:
                    now = _read(conn)
                    read_at = time.monotonic()
                    if now != last:
                        last = now
                        self._move()

    def _move(self) -> None:
        with self._lock:
            self._seen += 1
            self._version = self._seen + self._bumped


def _read(conn: Any) -> str:
    row = conn.execute(_SNAPSHOT).fetchone()
    return str(row[0])

