"""Bulk-load a valid log fast (for the export memory test and the benchmark): events with the exact
RFC 8785 bytes, chained, every complete subtree in audit_nodes, and the head row -- what record() of
document version 1 would have written, without its per-event round trips. Version 1 events carry no
per-key counters, so the head says counting starts after them (as migration 6 does for an old log)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

from audit import merkle
from audit.models import HEAD_ID, node_key
from store.db import Database

TS = "2026-01-01T00:00:00.000000Z"
TENANTS = ("acme", "globex", "initech")
ACTIONS = ("svid.issue", "grant.approve", "policy.activate", "flow.allow")
_INDEXES = {
    "ix_audit_events_tenant_seq": "(tenant, seq)",
    "ix_audit_events_action_seq": "(action, seq)",
    "ix_audit_events_ts": "(ts)",
}


def document_text(i: int, prev: str) -> str:
    """RFC 8785 of a plain-ASCII event document, written out directly (checked against rfc8785 in tests)."""
    tenant = TENANTS[i % 3]
    return (
        f'{{"action":"{ACTIONS[i % 4]}","actor":{{"id":"u{i % 11}","kind":"admin"}},'
        f'"object":{{"id":"o{i}","type":"t"}},"prev_hash":"{prev}","reason":null,"request_id":null,'
        f'"seq":{i},"summary":{{}},"tenant":"{tenant}","ts":"{TS}","v":1}}'
    )


def _events(n: int) -> Iterator[tuple[Any, ...]]:
    prev = "0" * 64
    sha = hashlib.sha256
    ts = TS.replace("T", " ").replace("Z", "")
    for i in range(n):
        data = document_text(i, prev)
        leaf = sha(b"\x00" + data.encode()).hexdigest()
        yield (
            i,
            ts,
            f"u{i % 11}",
            "admin",
            TENANTS[i % 3],
            ACTIONS[i % 4],
            "t",
            f"o{i}",
            "{}",
            None,
            None,
            prev,
            leaf,
            data,
        )
        prev = leaf


_EVENT_COLUMNS = (
    "seq, ts, actor_id, actor_kind, tenant, action, object_type, object_id, summary, reason, request_id, "
    "prev_hash, leaf_hash, data"
)


def _head_columns(cur: Any, pg: bool) -> set[str]:
    if pg:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'audit_head'")
        return {str(r[0]) for r in cur.fetchall()}
    cur.execute("PRAGMA table_info(audit_head)")
    return {str(r[1]) for r in cur.fetchall()}


def bulk_fill(db: Database, n: int, chunk: int = 50_000) -> None:
    """Append n events to an empty log (SQLite: executemany without journal; PostgreSQL: COPY)."""
    pg = db.dialect == "postgresql"
    leaves: list[bytes] = []
    db.engine.dispose()  # alone on the file, SQLite may skip the journal for the load
    raw = db.engine.raw_connection()
    try:
        cur = raw.cursor()
        if not pg:
            cur.execute("PRAGMA journal_mode=OFF")
            cur.execute("PRAGMA synchronous=OFF")
            cur.execute("BEGIN")
        for name in _INDEXES:
            cur.execute(f"DROP INDEX {name}")

        def rows() -> Iterator[tuple[Any, ...]]:
            for row in _events(n):
                leaves.append(bytes.fromhex(row[12]))
                yield row if not pg else (row[0], row[1] + "+00", *row[2:])

        if pg:
            with cur.copy(f"COPY audit_events ({_EVENT_COLUMNS}) FROM STDIN") as copy:
                for row in rows():
                    copy.write_row(row)
        else:
            sql = f"INSERT INTO audit_events ({_EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            it = rows()
            while batch := list(itertools.islice(it, chunk)):
                cur.executemany(sql, batch)
        ts = TS.replace("T", " ").replace("Z", "")
        levels = [leaves]
        nodes: list[tuple[int, bytes]] = []
        while len(levels[-1]) > 1:
            below = levels[-1]
            levels.append([merkle.hash_children(below[j], below[j + 1]) for j in range(0, len(below) - 1, 2)])
            nodes.extend((node_key(len(levels) - 1, j), h) for j, h in enumerate(levels[-1]))
        if pg:
            with cur.copy("COPY audit_nodes (key, hash) FROM STDIN") as copy:
                for node in nodes:
                    copy.write_row(node)
        else:
            cur.executemany("INSERT INTO audit_nodes (key, hash) VALUES (?, ?)", nodes)
        frontier = [levels[lv][idx].hex() for lv, idx in merkle.range_nodes(0, n)]
        for name, ddl in _INDEXES.items():
            cur.execute(f"CREATE INDEX {name} ON audit_events {ddl}")
        p = "%s" if pg else "?"
        head: dict[str, Any] = {"size": n, "last_leaf": leaves[-1].hex() if leaves else "0" * 64,
                                "frontier": json.dumps(frontier)}
        if "counted_from" in _head_columns(cur, pg):  # a log from before schema step 6 has no counters
            head.update(counted_from=n, last_ts=ts if not pg else ts + "+00")
        cur.execute(
            f"UPDATE audit_head SET {', '.join(f'{k} = {p}' for k in head)} WHERE id = {HEAD_ID}", tuple(head.values())
        )
        raw.commit()
        if not pg:
            cur.execute("PRAGMA journal_mode=WAL")
        else:
            cur.execute("ANALYZE")
            raw.commit()
    finally:
        raw.close()
