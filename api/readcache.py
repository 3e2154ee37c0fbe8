"""Read caches for the hot authorized reads, validated on every request against a database change counter.

SQLite's `PRAGMA data_version` changes whenever any other connection (in this process or another one)
commits to the database file. A private connection that never writes therefore tells, in one cheap
call, whether anything at all changed since a value was cached: if the version is the same, every table
is as it was, so the cached token row or grant page is exactly what a fresh query would return. Values
that also depend on time carry a `valid_until` and are refused from then on. Exact.

PostgreSQL: the counter is the process's change feed (store/changes.py), which moves at once after this
process's own commits, and within a notification's delivery (about a millisecond) of any commit by another
process or replica, 50 ms at most when a notification is lost: a cached value may be served for that long
after a commit elsewhere (the bound tests/api/test_replicas.py measures and the README states), never
longer. A cache that must be exact (`bounded=False`: the token rows, whose revocation is in force from the
next request on) is off on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import threading
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from store.db import Database

V = TypeVar("V")


class ChangeWatch:
    """The database's change counter (SQLite: read on a private read-only connection; PostgreSQL: the
    process's change feed); None when unsupported, switched off or unknown."""

    def __init__(self, db: Database, *, enabled: bool = True, bounded: bool = True) -> None:
        """`bounded=False`: only an exact counter will do (SQLite's); on PostgreSQL nothing is cached."""
        engine = db.engine
        self._path = engine.url.database if engine.dialect.name == "sqlite" and enabled else None
        if self._path in (None, "", ":memory:"):
            self._path = None
        self._db = db if engine.dialect.name == "postgresql" and enabled and bounded else None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def version(self) -> int | None:
        if self._db is not None:
            return self._db.change_version()
        if self._path is None:
            return None
        with self._lock:
            try:
                if self._conn is None:
                    uri = f"file:{urllib.parse.quote(self._path)}?mode=ro"
                    self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
                row = self._conn.execute("PRAGMA data_version").fetchone()
            except sqlite3.Error:
                self._conn = None
                return None
        return int(row[0])


@dataclass(frozen=True)
class _Entry(Generic[V]):
    version: int
    valid_until: datetime | None
    value: V


class ReadCache(Generic[V]):
    """key -> value, trusted only while the database version is unchanged and before valid_until."""

    def __init__(self, watch: ChangeWatch, size: int = 4096) -> None:
        self.watch = watch
        self.size = size
        self._entries: OrderedDict[Any, _Entry[V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, now: datetime) -> tuple[V | None, int | None]:
        """(value or None, the current version to store a fresh value under)."""
        version = self.watch.version()
        if version is None:
            return None, None
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry.version != version or (entry.valid_until is not None and now >= entry.valid_until):
            return None, version
        return entry.value, version

    def put(self, key: Any, version: int | None, value: V, valid_until: datetime | None = None) -> None:
        if version is None:
            return
        with self._lock:
            self._entries[key] = _Entry(version, valid_until, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
