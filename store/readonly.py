"""A read-only view of the embedded SQLite database through the standard library's sqlite3, for the CLI's
read-only local commands (`policy list`, `ca status`): importing SQLAlchemy alone takes longer than such a
command may (< 0.3 s to its answer). The queries are not written here: each is one SQL text its domain
keeps (policy/reads.py, pki/schedule.py) and its service runs through SQLAlchemy too, so both paths read the
same rows; tests/cli/test_read_path.py holds their outputs equal.

Values come back as the ORM gives them on SQLite, decoded by the column's declared type: JSON parsed,
BOOLEAN as bool, DATETIME as a naive datetime (the project stores UTC; the readers apply `as_utc`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

DB_FILE = "trustfabric.db"  # the embedded database's file in the data directory (store.db.sqlite_url too)
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "JSON": json.loads,
    "BOOLEAN": bool,
    "DATETIME": datetime.fromisoformat,
}


class Record:
    """One row, its columns as attributes (what the readers take from an ORM object too)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # for mypy: columns are dynamic
        raise AttributeError(name)


class ReadOnlyDb:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._types: dict[str, dict[str, str]] = {}

    def rows(self, sql: str, table: str, params: Mapping[str, Any] | None = None) -> list[Record]:
        """The rows `sql` selects from `table` (whose declared column types decode the values)."""
        types = self._declared(table)
        cur = self._conn.execute(sql, dict(params or {}))
        names = [d[0] for d in cur.description]
        decoders = [_DECODERS.get(types.get(n, "").upper()) for n in names]
        return [Record({n: (v if d is None or v is None else d(v)) for n, d, v in zip(names, decoders, row,
                                                                                      strict=True)})
                for row in cur.fetchall()]

    def _declared(self, table: str) -> dict[str, str]:
        found = self._types.get(table)
        if found is None:
            found = {r[1]: r[2] for r in self._conn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
            self._types[table] = found
        return found

    def close(self) -> None:
        self._conn.close()


def open_readonly(home: Path, schema_version: int) -> ReadOnlyDb | None:
    """The data directory's SQLite database opened read-only, when it exists and its schema is exactly
    `schema_version`; None otherwise (no database yet, another schema, a locked or unreadable file): the
    caller then takes the full path, which migrates and reports errors as it always has."""
    path = home / DB_FILE
    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA query_only = ON")
        applied = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        if applied is None or applied[0] != schema_version:
            conn.close()
            return None
    except sqlite3.Error:
        conn.close()
        return None
    return ReadOnlyDb(conn)
