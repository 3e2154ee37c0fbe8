"""Appending to the log and reading its Merkle tree. Callers pass their own session: the event commits
with the change it describes, or not at all.

Concurrency: an append locks the single `audit_head` row for the rest of the transaction
(`SELECT ... FOR UPDATE` on PostgreSQL; on SQLite the write transaction already began with
BEGIN IMMEDIATE and holds the database writer lock), so two transactions never read the same head
and sequence numbers stay contiguous. Within one transaction the head is cached on the session, so a
batch of appends costs one head read; the cache is dropped whenever any transaction of that session
ends (commit or rollback) and whenever a savepoint rolls back (a released savepoint keeps it: its appends
stay in the transaction, so a batch of group-committed writes, each in its own savepoint, reads the head once).

Under the same lock each event gets its time -- never earlier than the event before it, at full
precision (a caller's time truncated to the second is raised to the last event's time) -- and its
per-key counters (audit/counters.py). Events are document version 2; version 1 events (before
migration 6) lack counters and their times may go backwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, bindparam, event, insert, null, or_, select, update
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import SessionTransaction, configure_mappers
from sqlmodel import Session, col
from sqlmodel import select as sm_select

from audit import counters, merkle
from audit.actor import ACTOR_KINDS, TENANT_KINDS, Actor, ActorQuery, actor_document
from audit.errors import InvalidAuditEvent, ProofError
from audit.models import HEAD_ID, NODE_LEVEL_SHIFT, AuditCounter, AuditEvent, AuditHead, AuditNode, node_key
from audit.wire import GENESIS_HASH as GENESIS_HASH
from audit.wire import format_ts as format_ts
from core.canonical import canonical_json, is_plain, plain_canonical_json
from core.clock import as_utc, system_clock
from core.slugs import is_slug
from core.vocabulary import AUDIT_ACTION_PATTERN
from store import deferred
from store.changes import CHANNEL
from store.db import driver_rows, notified, pg_array

DOCUMENT_VERSION = 2
MAX_EVENT_BYTES = 64 * 1024  # an event's hashed bytes; the field limits keep real events far below it
ACTION_RE = re.compile(AUDIT_ACTION_PATTERN)
_HEAD_CACHE = "tf_audit_head"
_IN_CHUNK = 500

_events = AuditEvent.__table__  # type: ignore[attr-defined]
_nodes = AuditNode.__table__  # type: ignore[attr-defined]
_head = AuditHead.__table__  # type: ignore[attr-defined]
_counters = AuditCounter.__table__  # type: ignore[attr-defined]
# Built once: constructing SQLAlchemy statements per append costs more than executing them.
_INSERT_EVENT = insert(_events)
_INSERT_NODE = insert(_nodes)
_UPDATE_HEAD = (
    update(_head)
    .where(_head.c.id == HEAD_ID)
    .values(
        size=bindparam("h_size"),
        last_leaf=bindparam("h_last"),
        frontier=bindparam("h_frontier"),
        last_ts=bindparam("h_ts"),
    )
)


def event_document(event: AuditEvent) -> dict[str, Any]:
    """The hashed content of an event: every field except its own leaf hash. The version and the
    counters are not columns; they are taken from the stored bytes. The actor's tenant is there only when
    the event has one (audit/actor.py): never in events written before actors named theirs."""
    stored = json.loads(event.data) if event.data else {}
    doc = {
        "v": stored.get("v", 1),
        "seq": event.seq,
        "ts": format_ts(event.ts),
        "actor": actor_document(event.actor_id, event.actor_kind, event.actor_tenant),
        "tenant": event.tenant,
        "action": event.action,
        "object": {"type": event.object_type, "id": event.object_id},
        "summary": event.summary,
        "reason": event.reason,
        "request_id": event.request_id,
        "prev_hash": event.prev_hash,
    }
    if "counters" in stored:
        doc["counters"] = stored["counters"]
    return doc


def leaf_hash(document: Mapping[str, Any]) -> str:
    """RFC 6962 leaf hash, hex: SHA-256(0x00 || RFC 8785 canonical JSON)."""
    return merkle.hash_leaf(canonical_json(dict(document))).hex()


@dataclass
class _HeadState:
    tree: merkle.CompactRange  # the right edge: one hash per set bit of the size, high to low
    last_leaf: bytes
    last_ts: datetime | None
    counts: dict[str, int]  # counters read (or advanced) in this transaction
    locked: int = 0  # the size when the lock was taken
    scanned: _Scan | None = None  # the scan read with the lock (exact as of `locked`)
    appended: tuple[str, ...] = ()  # the actions of the events this transaction appended since, in order

    @property
    def size(self) -> int:
        return self.tree.end

    def known_scan(self, since: int, keeping: tuple[str, ...]) -> tuple[str | None] | None:
        """(the first action from `since` that `keeping` does not cover, or None) when known without reading:
        the scan read with the lock started at or before `since` under the same `keeping` and found nothing,
        so only this transaction's own appends can hold one; None when a read must tell (a group commit's
        first member reads, the rest of its grant decisions are answered here)."""
        scan = self.scanned
        if scan is None or scan.keeping != keeping or scan.found is not None or not scan.since <= since <= self.size:
            return None
        for action in self.appended[max(0, since - self.locked):]:
            if not _covers(keeping, action):
                return (action,)
        return (None,)


def _covers(keeping: tuple[str, ...], action: str) -> bool:
    """Whether `keeping` covers `action` as _not_kept's SQL has it (an entry ending in '.' covers the actions it
    prefixes)."""
    return any(action.startswith(p) if p.endswith(".") else action == p for p in keeping)


@event.listens_for(OrmSession, "after_transaction_end")
def _drop_head_cache(session: OrmSession, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost: not a savepoint, nor the inner transaction of a flush
        session.info.pop(_HEAD_CACHE, None)


@event.listens_for(OrmSession, "after_soft_rollback")
def _drop_head_cache_on_rollback(session: OrmSession, _transaction: SessionTransaction) -> None:
    session.info.pop(_HEAD_CACHE, None)  # any rollback, a savepoint's included: its appends are gone


def _locked_head(session: Session, keys: Iterable[str] = (), scan: _Scan | None = None) -> _HeadState:
    """The head, locked for the rest of the transaction (cached in the session once read). When read here, in the
    same statement: the counters of `keys` and (`scan`) the first event from scan.since whose action scan.keeping
    does not cover (its result in scan.found), so the first append of a transaction costs one round trip, not
    two or three.

    Why that is exact: in PostgreSQL's READ COMMITTED a statement reads one snapshot, taken before it waits for
    the lock; when a writer commits in between, the locked row comes back in its newest version while every
    other part of the statement still shows the snapshot. So on psycopg the lock and the reads are one call of
    tf_lock_audit_head (schema step 12), whose second statement takes its snapshot with the lock held: one round
    trip whether or not it waited (it did in most batches with several replicas writing, and a second statement
    then read the counters and the scan again). Elsewhere the statement also reads the head's size as its
    snapshot sees it: only when that equals the locked size did nothing commit in between (every write to the
    counters and the events is an append, made under this lock, that grows the size), and the counters and
    the scan are current; otherwise they are read again, in a statement of their own (a new snapshot, under
    the lock). SQLite takes its writer lock at BEGIN: the two sizes are always equal there."""
    cached = session.info.get(_HEAD_CACHE)
    if isinstance(cached, _HeadState):
        return cached
    wanted = sorted(set(keys))
    conn = session.connection()
    if _psycopg(conn):  # straight to the driver: the call every grant and issuance batch starts with
        rows: Any = [_PgLocked(r[0], r[1], r[2], r[3], r[0], r[4], r[5], r[6])  # read under the lock: seen = size
                     for r in driver_rows(conn, _PG_LOCK_HEAD, _pg_lock_params(wanted, scan))]
    else:
        rows = conn.execute(_locked_read(scan), _read_params(wanted, scan)).all()
    if not rows:
        raise InvalidAuditEvent("the audit log head row is missing: the database was not migrated")
    row = rows[0]
    tree = merkle.CompactRange(0, int(row.size), [bytes.fromhex(h) for h in row.frontier])
    state = _HeadState(tree, bytes.fromhex(row.last_leaf), as_utc(row.last_ts) if row.last_ts else None, {},
                       locked=tree.end, scanned=scan)
    if int(row.seen) == int(row.size):
        found = {r[-2]: int(r[-1]) for r in rows if r[-2] is not None}  # key, count: the last two columns
        state.counts.update({k: found.get(k, 0) for k in wanted})
        if scan is not None:
            scan.found = row.unsettling
    elif scan is not None or wanted:  # a writer committed while this one waited: read them again, now (on
        # PostgreSQL through SQLAlchemy's statements only; psycopg's call read them with the lock held)
        again = conn.execute(_current_read(scan), _read_params(wanted, scan)).all()
        found = {r[-2]: int(r[-1]) for r in again if r[-2] is not None}
        state.counts.update({k: found.get(k, 0) for k in wanted})
        if scan is not None:
            scan.found = again[0][0] if again else None  # the first column: unsettling
    session.info[_HEAD_CACHE] = state
    return state


@dataclass
class _Scan:
    """The first event from `since` whose action `keeping` does not cover (an entry ending in '.' covers the
    actions it prefixes), read with the head lock: `found` is its action, or None."""

    since: int
    keeping: tuple[str, ...]
    found: str | None = None


def _not_kept(keeping: tuple[str, ...]) -> Any:
    return ~or_(*(_events.c.action.startswith(p, autoescape=True) if p.endswith(".") else _events.c.action == p
                  for p in keeping))


def _unsettling(scan: _Scan | None) -> Any:
    if scan is None:
        return null()
    return (select(_events.c.action).where(_events.c.seq >= bindparam("since"), _not_kept(scan.keeping))
            .order_by(_events.c.seq).limit(1).scalar_subquery())


_LOCKED_READS: dict[tuple[str, ...] | None, Any] = {}
_CURRENT_READS: dict[tuple[str, ...] | None, Any] = {}


def _locked_read(scan: _Scan | None) -> Any:
    """Built once per `keeping` (building it per write cost more than running it)."""
    key = None if scan is None else scan.keeping
    stmt = _LOCKED_READS.get(key)
    if stmt is None:
        seen = select(_head.c.size).where(_head.c.id == HEAD_ID).scalar_subquery()  # as the snapshot has it
        stmt = _LOCKED_READS[key] = (
            select(_head.c.size, _head.c.last_leaf, _head.c.frontier, _head.c.last_ts, seen.label("seen"),
                   _unsettling(scan).label("unsettling"), _counters.c.key, _counters.c.count)
            .select_from(_head.outerjoin(_counters, _counters.c.key.in_(bindparam("keys", expanding=True))))
            .where(_head.c.id == HEAD_ID).with_for_update(of=_head))
    return stmt


_SCANS_ALONE: dict[tuple[str, ...], Any] = {}


def _scan_alone(scan: _Scan) -> Any:
    """_unsettling as a statement of its own, built once per `keeping`."""
    stmt = _SCANS_ALONE.get(scan.keeping)
    if stmt is None:
        stmt = _SCANS_ALONE[scan.keeping] = select(_unsettling(scan).label("unsettling"))
    return stmt


def _current_read(scan: _Scan | None) -> Any:
    key = None if scan is None else scan.keeping
    stmt = _CURRENT_READS.get(key)
    if stmt is None:
        stmt = _CURRENT_READS[key] = (
            select(_unsettling(scan).label("unsettling"), _counters.c.key, _counters.c.count)
            .select_from(_head.outerjoin(_counters, _counters.c.key.in_(bindparam("keys", expanding=True))))
            .where(_head.c.id == HEAD_ID))
    return stmt


class _PgLocked(NamedTuple):
    """A row of tf_lock_audit_head (`seen`: its size), named as _locked_read's."""

    size: int
    last_leaf: str
    frontier: list[str]
    last_ts: datetime | None
    seen: int
    unsettling: str | None
    key: str | None
    counted: int | None  # the counter's count (`count` is a tuple's method)


def _psycopg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def _pg_unsettling(scan: _Scan | None) -> str:
    """_unsettling in psycopg's SQL; the `keeping` entries are parameters (k0, k1, ...), never SQL text."""
    if scan is None:
        return "NULL"
    kept = " OR ".join(f"starts_with(e.action, %(k{i})s)" if p.endswith(".") else f"e.action = %(k{i})s"
                       for i, p in enumerate(scan.keeping))
    return (f"(SELECT e.action FROM audit_events e WHERE e.seq >= %(since)s AND NOT ({kept or 'FALSE'}) "  # noqa: S608
            "ORDER BY e.seq LIMIT 1)")


# the head's lock and the reads under it (schema step 12): keys, since (null: no scan), exact actions, LIKE patterns
_PG_LOCK_HEAD = "SELECT * FROM tf_lock_audit_head(%s::text[], %s::bigint, %s::text[], %s::text[])"
_KEEPING_ARRAYS: dict[tuple[str, ...], tuple[str, str]] = {}


def _pg_lock_params(keys: list[str], scan: _Scan | None) -> tuple[str, int | None, str, str]:
    if scan is None:
        return pg_array(keys), None, "{}", "{}"
    arrays = _KEEPING_ARRAYS.get(scan.keeping)
    if arrays is None:  # as _pg_unsettling has them: an entry ending in '.' is a prefix, any other an action
        arrays = _KEEPING_ARRAYS[scan.keeping] = (
            pg_array([k for k in scan.keeping if not k.endswith(".")]),
            pg_array([_like_prefix(k) for k in scan.keeping if k.endswith(".")]))
    return pg_array(keys), scan.since, *arrays


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching what starts with `prefix` (its backslashes, % and _ escaped: LIKE's own escape)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _pg_read_params(keys: list[str], scan: _Scan | None) -> dict[str, Any]:
    params = _read_params(keys, scan)
    params["keys"] = pg_array(keys)
    if scan is not None:
        params.update((f"k{i}", p) for i, p in enumerate(scan.keeping))
    return params


def _read_params(keys: list[str], scan: _Scan | None) -> dict[str, Any]:
    params: dict[str, Any] = {"keys": keys}
    if scan is not None:
        params["since"] = scan.since
    return params


def _text(value: str | None, what: str, max_len: int, *, required: bool) -> str | None:
    if value is None or value == "":
        if required:
            raise InvalidAuditEvent(f"audit event {what} is required")
        return None
    if not isinstance(value, str):
        raise InvalidAuditEvent(f"audit event {what} must be a string, not {type(value).__name__}")
    if len(value) > max_len:
        raise InvalidAuditEvent(f"audit event {what} is {len(value)} characters; the limit is {max_len}")
    if "\x00" in value:
        raise InvalidAuditEvent(f"audit event {what} contains a NUL character")
    return value


def _canonical_summary(summary: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool, str]:
    """The summary as its canonical JSON parses back, whether it is plain (core.canonical.is_plain): then
    so is its event's document, which the C encoder serializes without another walk; and that JSON."""
    if summary is None:
        return {}, True, "{}"
    if not isinstance(summary, Mapping):
        raise InvalidAuditEvent("audit event summary must be a JSON object")
    copy = dict(summary)
    plain = is_plain(copy)
    try:
        data = plain_canonical_json(copy) if plain else canonical_json(copy)
    except Exception as exc:  # rfc8785 raises several unrelated types for unrepresentable values
        raise InvalidAuditEvent(f"audit event summary is not representable as canonical JSON: {exc}") from exc
    if len(data) > 16_384:
        raise InvalidAuditEvent(f"audit event summary is {len(data)} bytes; the limit is 16384")
    if plain and all(type(value) is not dict and type(value) is not list for value in copy.values()):
        # plain and flat: every value a string, a safe integer, a boolean or null, each of which parses back as
        # itself, so the copy is what parsing gave (4 us fewer on every issuance)
        return copy, True, data.decode()
    text = data.decode()
    parsed: dict[str, Any] = json.loads(text)
    return parsed, plain, text


_COLUMNS = (
    "seq",
    "ts",
    "actor_id",
    "actor_kind",
    "tenant",
    "action",
    "object_type",
    "object_id",
    "summary",
    "reason",
    "request_id",
    "prev_hash",
    "leaf_hash",
    "data",
    "actor_tenant",
)
_UPSERT_COUNTER = (
    "INSERT INTO audit_counters (key, count, last_leaf) VALUES ({p}, {p}, {p}) "
    "ON CONFLICT (key) DO UPDATE SET count = excluded.count, last_leaf = excluded.last_leaf"
)
# Appends go straight to the driver: SQLAlchemy's per-statement machinery costs more than the statements.
_DRIVER_SQL = {
    "sqlite": (
        "INSERT INTO audit_events (seq, ts, actor_id, actor_kind, tenant, action, object_type, object_id, "
        "summary, reason, request_id, prev_hash, leaf_hash, data, actor_tenant) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        "INSERT INTO audit_nodes (key, hash) VALUES (?, ?)",
        "UPDATE audit_head SET size = ?, last_leaf = ?, frontier = ?, last_ts = ? WHERE id = 1",
        _UPSERT_COUNTER.format(p="?"),
    ),
}
# PostgreSQL: the event(s), their completed subtrees, the counters and the new head in one round trip (a batch's
# events, store/deferred.py, as one array per column).
_PG_EVENT = (
    "INSERT INTO audit_events (seq, ts, actor_id, actor_kind, tenant, action, object_type, object_id, "
    "summary, reason, request_id, prev_hash, leaf_hash, data, actor_tenant) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::json, %s, %s, %s, %s, %s, %s)"
)
_PG_TREE = (
    "nd AS (INSERT INTO audit_nodes (key, hash) SELECT * FROM unnest(%s::bigint[], %s::bytea[])), "
    "ct AS (INSERT INTO audit_counters (key, count, last_leaf) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[]) "
    "ON CONFLICT (key) DO UPDATE SET count = excluded.count, last_leaf = excluded.last_leaf) "
    "UPDATE audit_head SET size = %s, last_leaf = %s, frontier = %s::json, last_ts = %s WHERE id = 1 "
    "RETURNING pg_notify('trustfabric_changes', '')"  # the change feeds' (store/db.py), no statement of its own
)
assert CHANNEL == "trustfabric_changes"
_PG_EVENTS = (  # many events in one statement, as one JSON array the server takes apart (psycopg adapting an
    # array per column cost ~80 us of client CPU per event)
    "INSERT INTO audit_events (seq, ts, actor_id, actor_kind, tenant, action, object_type, object_id, "
    "summary, reason, request_id, prev_hash, leaf_hash, data, actor_tenant) "
    "SELECT seq, ts, actor_id, actor_kind, tenant, action, object_type, object_id, summary, reason, "
    "request_id, prev_hash, leaf_hash, data, actor_tenant FROM json_to_recordset(%s::json) AS e(seq bigint, "
    "ts timestamptz, actor_id text, actor_kind text, tenant text, action text, object_type text, object_id text, "
    "summary json, reason text, request_id text, prev_hash text, leaf_hash text, data text, actor_tenant text)"
)
_PG_APPEND = f"WITH ev AS ({_PG_EVENT}), {_PG_TREE}"
_PG_APPEND_MANY = f"WITH ev AS ({_PG_EVENTS}), {_PG_TREE}"
assert HEAD_ID == 1


@dataclass
class _Batch:
    """A group commit's appends, written together at its flush: the head and each counter as they end."""

    events: list[dict[str, Any]]
    summaries: list[str]  # each event's summary as the JSON its column stores
    nodes: list[tuple[int, bytes]]
    counted: dict[str, tuple[int, str]]
    head: _HeadState | None = None


def _write(
    session: Session,
    fields: dict[str, Any],
    summary: str,
    nodes: list[tuple[int, bytes]],
    counted: list[tuple[str, int, str]],
    head: _HeadState,
) -> None:
    batch = deferred.batched(session, "audit", lambda: _Batch([], [], [], {}), lambda b: _write_batch(session, b))
    if batch is None:
        _write_rows(session, [fields], [summary], nodes, counted, head)
        return
    batch.events.append(fields)
    batch.summaries.append(summary)
    batch.nodes += nodes
    batch.counted.update((key, (count, last)) for key, count, last in counted)
    batch.head = head


def _write_batch(session: Session, batch: _Batch) -> None:
    if batch.head is not None:
        counted = [(key, count, last) for key, (count, last) in batch.counted.items()]
        _write_rows(session, batch.events, batch.summaries, batch.nodes, counted, batch.head)


def _write_rows(
    session: Session,
    events: list[dict[str, Any]],
    summaries: list[str],
    nodes: list[tuple[int, bytes]],
    counted: list[tuple[str, int, str]],
    head: _HeadState,
) -> None:
    """The events (`summaries`: each one's summary column, its canonical JSON), their completed subtrees, the
    counters' new values (one per key) and the head after them."""
    conn = session.connection()
    dialect = conn.dialect.name
    frontier = [h.hex() for h in head.tree.hashes]
    pg = dialect == "postgresql" and conn.dialect.driver == "psycopg"
    sql = _DRIVER_SQL.get(dialect)
    if sql is None and not pg:  # any other backend: the portable (slower) path
        conn.execute(_INSERT_EVENT, events)
        if nodes:
            conn.execute(_INSERT_NODE, [{"key": k, "hash": h} for k, h in nodes])
        for key, count, last in counted:
            if not conn.execute(
                update(_counters).where(_counters.c.key == key).values(count=count, last_leaf=last)
            ).rowcount:
                conn.execute(insert(_counters).values(key=key, count=count, last_leaf=last))
        conn.execute(
            _UPDATE_HEAD,
            {"h_size": head.size, "h_last": head.last_leaf.hex(), "h_frontier": frontier, "h_ts": head.last_ts},
        )
        return
    last_ts: Any = head.last_ts
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if pg:
            tree = [pg_array([k for k, _ in nodes]), pg_array([h for _, h in nodes]),
                    pg_array([k for k, _, _ in counted]), pg_array([c for _, c, _ in counted]),
                    pg_array([x for _, _, x in counted]), head.size, head.last_leaf.hex(), json.dumps(frontier),
                    last_ts]
            if len(events) == 1:
                cur.execute(_PG_APPEND, [*_driver_values(events[0], summaries[0]), *tree])
            else:
                batch = [{**fields, "ts": fields["ts"].isoformat()} for fields in events]
                cur.execute(_PG_APPEND_MANY, [json.dumps(batch, ensure_ascii=False), *tree])
            notified(conn)
            return
        assert sql is not None
        rows = []
        for fields, summary in zip(events, summaries, strict=True):
            values = _driver_values(fields, summary)
            values[1] = last_ts = _sqlite_time(fields["ts"])
            rows.append(values)
        cur.executemany(sql[0], rows)
        if nodes:
            cur.executemany(sql[1], nodes)
        cur.executemany(sql[3], counted)
        cur.execute(sql[2], (head.size, head.last_leaf.hex(), json.dumps(frontier), last_ts))
    finally:
        cur.close()


def _sqlite_time(at: datetime) -> str:
    """SQLAlchemy's SQLite form of a UTC time ('%Y-%m-%d %H:%M:%S.%f', the year in four digits), without strftime's
    cost (~1.5 us)."""
    return at.replace(tzinfo=None).isoformat(" ", "microseconds")


def _driver_values(fields: dict[str, Any], summary: str) -> list[Any]:
    values = [fields[c] for c in _COLUMNS]
    values[8] = summary  # the canonical JSON it was hashed in (not serialised again: 4-5 us an event)
    return values


def _counts(session: Session, head: _HeadState, keys: Iterable[str]) -> dict[str, int]:
    """The current count of each key: from this transaction's cache, else one read for the rest."""
    missing = [k for k in keys if k not in head.counts]
    if missing:
        wanted = select(_counters.c.key, _counters.c.count).where(_counters.c.key.in_(missing))
        rows = session.connection().execute(wanted)
        found = {key: int(count) for key, count in rows}
        head.counts.update({k: found.get(k, 0) for k in missing})
    return head.counts


def record(
    session: Session,
    *,
    actor: Actor,
    action: str,
    object_type: str,
    object_id: str,
    tenant: str | None = None,
    summary: Mapping[str, Any] | None = None,
    reason: str | None = None,
    request_id: str | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """Append one event inside the caller's transaction; it commits or rolls back with the change.

    Bad input raises InvalidAuditEvent (an InvalidInput) before anything is written; so does an actor of a tenant
    kind without its tenant, or a platform one with one: an event never leaves open whose `alice` acted.
    """
    event = _validated(actor, action, object_type, object_id, tenant, summary, reason, request_id, at)
    if deferred.later(session, lambda: _append(session, event)):
        # a group commit's member: appended under the head lock once every member made its change
        # (store/deferred.py); numbered then, so this event has no sequence number yet
        return AuditEvent.model_construct(seq=-1, actor_id=event.actor_id, actor_kind=event.actor_kind,
                                          actor_tenant=event.actor_tenant, tenant=event.tenant, action=event.action,
                                          object_type=event.object_type, object_id=event.object_id,
                                          summary=event.body, reason=event.reason, request_id=event.request_id)
    fields = _append(session, event)
    configure_mappers()  # no-op once done; model_construct skips the step that would trigger it
    return AuditEvent.model_construct(**fields)


def record_only(
    session: Session,
    *,
    actor: Actor,
    action: str,
    object_type: str,
    object_id: str,
    tenant: str | None = None,
    summary: Mapping[str, Any] | None = None,
    reason: str | None = None,
    request_id: str | None = None,
    at: datetime | None = None,
) -> None:
    """`record`, for a caller that does not use the event: the same checks and the same append, without building
    the AuditEvent object it would drop (~15 us of an SVID issuance's CPU)."""
    event = _validated(actor, action, object_type, object_id, tenant, summary, reason, request_id, at)
    if not deferred.later(session, lambda: _append(session, event)):
        _append(session, event)


class _Event(NamedTuple):
    """An event's validated parts, before it is numbered under the head lock."""

    actor_kind: str
    actor_id: str
    actor_tenant: str | None
    action: str
    object_type: str
    object_id: str
    tenant: str | None
    body: dict[str, Any]
    reason: str | None
    request_id: str | None
    requested: datetime
    plain: bool  # the body is plain (core.canonical.is_plain): then so is the event's document
    summary_json: str  # the body's canonical JSON


def _validated(actor: Actor, action: str, object_type: str, object_id: str, tenant: str | None,
               summary: Mapping[str, Any] | None, reason: str | None, request_id: str | None,
               at: datetime | None) -> _Event:
    """record's arguments checked (InvalidAuditEvent saying which is wrong), the summary in its canonical form."""
    if not isinstance(actor, Actor) or actor.kind not in ACTOR_KINDS:
        raise InvalidAuditEvent(f"unknown actor kind {getattr(actor, 'kind', actor)!r}")
    actor_id = str(_text(actor.id, "actor id", 512, required=True))
    actor_tenant = actor.tenant
    if actor.kind in TENANT_KINDS:
        if not isinstance(actor_tenant, str) or not is_slug(actor_tenant):
            raise InvalidAuditEvent(f"a {actor.kind} actor names its tenant (a DNS-label slug), not {actor_tenant!r}")
    elif actor_tenant is not None:
        raise InvalidAuditEvent(f"a {actor.kind} actor belongs to no tenant, yet names {actor_tenant!r}")
    if not isinstance(action, str) or len(action) > 64 or not ACTION_RE.fullmatch(action):
        raise InvalidAuditEvent(
            f"audit action {action!r} must look like 'noun.verb' (lowercase, dot-separated, <= 64 chars)"
        )
    otype = str(_text(object_type, "object type", 64, required=True))
    oid = str(_text(object_id, "object id", 512, required=True))
    if tenant is not None and (not isinstance(tenant, str) or not is_slug(tenant)):
        raise InvalidAuditEvent(f"audit event tenant {tenant!r} is not a DNS-label slug")
    why = _text(reason, "reason", 2000, required=False)
    rid = _text(request_id, "request id", 128, required=False)
    if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
        raise InvalidAuditEvent("audit event time must be a timezone-aware datetime")
    requested = (at or system_clock()).astimezone(UTC)
    body, plain, text = _canonical_summary(summary)
    return _Event(actor.kind, actor_id, actor_tenant, action, otype, oid, tenant, body, why, rid, requested, plain,
                  text)


def _append(session: Session, event: _Event) -> dict[str, Any]:
    """Append one validated event: lock the head, number, hash and write it; its columns (the event is built
    from them only when a caller gets it: a deferred append's is dropped)."""
    actor_kind, actor_id, actor_tenant, action, otype, oid, tenant, body, why, rid, requested, plain, text = event
    keys = counters.keys_of(tenant, action)
    current = _locked_head(session, keys.values())
    head = _HeadState(current.tree.copy(), current.last_leaf, current.last_ts, current.counts, current.locked,
                      current.scanned, (*current.appended, action))
    seq = head.size
    prev = head.last_leaf.hex() if seq else GENESIS_HASH
    ts = requested if head.last_ts is None or requested >= head.last_ts else head.last_ts  # never back in time
    counts = _counts(session, head, keys.values())
    fields: dict[str, Any] = {
        "seq": seq,
        "ts": ts,
        "actor_id": actor_id,
        "actor_kind": actor_kind,
        "actor_tenant": actor_tenant,
        "tenant": tenant,
        "action": action,
        "object_type": otype,
        "object_id": oid,
        "summary": body,
        "reason": why,
        "request_id": rid,
        "prev_hash": prev,
    }
    document: dict[str, Any] = {
        "v": DOCUMENT_VERSION,
        "seq": seq,
        "ts": format_ts(ts),
        "actor": actor_document(actor_id, actor_kind, actor_tenant),
        "tenant": tenant,
        "action": action,
        "object": {"type": otype, "id": oid},
        "summary": body,
        "reason": why,
        "request_id": rid,
        "prev_hash": prev,
        "counters": {dim: counts[key] for dim, key in keys.items()},
    }
    data = plain_canonical_json(document) if plain else canonical_json(document)
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidAuditEvent(f"audit event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    leaf = merkle.hash_leaf(data)
    fields["leaf_hash"] = leaf.hex()
    fields["data"] = data.decode()

    new_nodes = _push_leaf(head, leaf)
    head.last_ts = ts
    counted = [(key, counts[key] + 1, leaf.hex()) for key in keys.values()]
    _write(session, fields, text, new_nodes, counted, head)
    for key, count, _last in counted:
        head.counts[key] = count
    session.info[_HEAD_CACHE] = head  # only once every write went through
    return fields


def _push_leaf(head: _HeadState, leaf: bytes) -> list[tuple[int, bytes]]:
    """Add a leaf to the cached right edge; returns the completed subtrees (node key, hash) to store."""
    created: list[tuple[int, bytes]] = []
    head.tree.append_leaf_hash(leaf, lambda level, index, node: created.append((node_key(level, index), node)))
    head.last_leaf = leaf
    return created


# --- reading the tree -------------------------------------------------------------------------------


def head_locked(session: Session) -> bool:
    """Whether this session's transaction holds the head's lock already (an append or lock_head took it)."""
    return isinstance(session.info.get(_HEAD_CACHE), _HeadState)


def lock_head(session: Session) -> int:
    """Lock the head for the rest of the transaction, as an append does, and return the log's size: a writer
    that must know nothing was appended since it last looked (the enforcer's publisher) checks under it."""
    return _locked_head(session).size


def lock_head_and_check(session: Session, since: int, keeping: tuple[str, ...],
                        upcoming: Iterable[tuple[str | None, str]] = ()) -> tuple[int, str | None]:
    """lock_head, and the action of the first event from `since` (up to the head) whose action `keeping` does not
    cover (an entry ending in '.' covers every action it prefixes), or None: what a writer checks when its
    decision was read before its transaction (policy.grants). `upcoming`: (tenant, action) of the events the
    transaction is about to append, whose counters are read with the lock. One round trip when the head is not
    locked yet (on SQLAlchemy's statements, two when a writer commits while this one waits for it)."""
    keys = [k for tenant, action in upcoming for k in counters.keys_of(tenant, action).values()]
    cached = session.info.get(_HEAD_CACHE)
    if isinstance(cached, _HeadState):  # locked already: the scan alone, from memory when it can tell
        size = cached.size
        if size == since:
            return size, None
        known = cached.known_scan(since, keeping)
        if known is not None:
            return size, known[0]
        scan = _Scan(since, keeping)
        conn = session.connection()
        if _psycopg(conn):
            rows: Any = driver_rows(conn, f"SELECT {_pg_unsettling(scan)}", _pg_read_params([], scan))
        else:
            rows = conn.execute(_scan_alone(scan), {"since": since}).all()
        return size, (rows[0][0] if rows else None)
    scan = _Scan(since, keeping)
    size = _locked_head(session, keys, scan).size
    return size, scan.found


def tree_size(session: Session) -> int:
    """The number of committed events (visible to this session)."""
    row = session.connection().execute(select(_head.c.size).where(_head.c.id == HEAD_ID)).one_or_none()
    return int(row.size) if row is not None else 0


def changes_since(session: Session, since: int, until: int, limit: int) -> tuple[list[tuple[str, str]], bool]:
    """(action, object id) of the events numbered since..until-1 in order (at most `limit`), and whether that
    is all of them: every committed change has its event, so these say what changed between two tree sizes."""
    rows = events_since(session, since, until, limit)
    return [(action, oid) for action, oid, _leaf in rows], len(rows) == until - since


def events_since(session: Session, since: int, until: int, limit: int) -> list[tuple[str, str, str]]:
    """(action, object id, leaf hash) of the events numbered since..until-1 in order, at most `limit`: the leaf
    hash says which history a cache's marker belongs to (each leaf hashes its predecessor's)."""
    rows = session.connection().execute(_EVENTS_SINCE, {"since": since, "until": until, "limit": limit})
    return [(r[0], r[1], r[2]) for r in rows]


def events_since_except(session: Session, since: int, until: int, common: frozenset[str]
                        ) -> list[tuple[int, str, str]]:
    """(seq, action, leaf hash) of the first and the last event numbered since..until-1 and of every one between
    whose action is not in `common`: what a cache needs to know that nothing but `common` happened since it was
    filled, without reading every event (the numbers have no gaps: each append takes the next under the lock)."""
    if until <= since:
        return []
    conn = session.connection()
    if _psycopg(conn):  # straight to the driver: SQLAlchemy's statement (its NOT IN expanded on every execution) cost
        # ~320 us of client CPU, once per group-committed issuance batch (pki/registrations.py)
        kept = _COMMON_ARRAYS.get(common)
        if kept is None:
            kept = _COMMON_ARRAYS[common] = pg_array(sorted(common))
        found = driver_rows(conn, _PG_EVENTS_EXCEPT, (since, until, since, until - 1, kept))
        return [(int(r[0]), r[1], r[2]) for r in found]
    stmt = _EVENTS_EXCEPT.get(common)
    if stmt is None:
        stmt = _EVENTS_EXCEPT[common] = (
            select(_events.c.seq, _events.c.action, _events.c.leaf_hash)
            .where(_events.c.seq >= bindparam("since"), _events.c.seq < bindparam("until"),
                   or_(_events.c.seq == bindparam("since"), _events.c.seq == bindparam("last"),
                       _events.c.action.not_in(sorted(common))))
            .order_by(_events.c.seq))
    rows = conn.execute(stmt, {"since": since, "until": until, "last": until - 1})
    return [(int(r[0]), r[1], r[2]) for r in rows]


def size_and_events_since(conn: Connection, since: int, limit: int) -> tuple[int, list[tuple[str, str, str]]]:
    """(the log's size, events_since(since, size, limit)) in one statement, so one snapshot even outside a
    transaction (store.db's `statement`: one round trip, where a transaction costs three more): what a reader
    polling the log for changes needs."""
    rows = conn.execute(_SIZE_AND_EVENTS, {"since": since, "limit": max(limit, 1)}).all()
    if not rows:
        return 0, []  # no head row: a database not migrated, an empty log
    return int(rows[0][0]), [(r[1], r[2], r[3]) for r in rows if r[1] is not None][:limit]


_EVENTS_EXCEPT: dict[frozenset[str], Any] = {}
_COMMON_ARRAYS: dict[frozenset[str], str] = {}
_PG_EVENTS_EXCEPT = ("SELECT seq, action, leaf_hash FROM audit_events WHERE seq >= %s AND seq < %s "
                     "AND (seq = %s OR seq = %s OR NOT (action = ANY(%s::text[]))) ORDER BY seq")
_EVENTS_SINCE = (select(_events.c.action, _events.c.object_id, _events.c.leaf_hash)
                 .where(_events.c.seq >= bindparam("since"), _events.c.seq < bindparam("until"))
                 .order_by(_events.c.seq).limit(bindparam("limit")))

_SIZE_AND_EVENTS = (
    select(_head.c.size, _events.c.action, _events.c.object_id, _events.c.leaf_hash)
    .select_from(_head.outerjoin(_events, and_(_events.c.seq >= bindparam("since"), _events.c.seq < _head.c.size)))
    .where(_head.c.id == HEAD_ID).order_by(_events.c.seq).limit(bindparam("limit")))


def node_hashes(session: Session, nodes: Iterable[merkle.Node]) -> dict[merkle.Node, bytes]:
    """Hashes of complete subtrees: level 0 from the events, higher levels from audit_nodes."""
    wanted = set(nodes)
    leaves = sorted(i for lv, i in wanted if lv == 0)
    keys = sorted(node_key(lv, i) for lv, i in wanted if lv > 0)
    out: dict[merkle.Node, bytes] = {}
    conn = session.connection()
    for start in range(0, len(leaves), _IN_CHUNK):
        chunk = leaves[start : start + _IN_CHUNK]
        for seq, h in conn.execute(select(_events.c.seq, _events.c.leaf_hash).where(_events.c.seq.in_(chunk))):
            out[(0, int(seq))] = bytes.fromhex(h)
    mask = (1 << NODE_LEVEL_SHIFT) - 1
    for start in range(0, len(keys), _IN_CHUNK):
        chunk = keys[start : start + _IN_CHUNK]
        for key, h in conn.execute(select(_nodes.c.key, _nodes.c.hash).where(_nodes.c.key.in_(chunk))):
            out[(int(key) >> NODE_LEVEL_SHIFT, int(key) & mask)] = bytes(h)
    missing = wanted - out.keys()
    if missing:
        raise ProofError(f"the audit tree is missing {len(missing)} node(s), e.g. {sorted(missing)[0]}")
    return out


def _check_size(session: Session, size: int) -> None:
    current = tree_size(session)
    if not 0 <= size <= current:
        raise ProofError(f"tree size {size} is out of range: the log holds {current} events")


def _range_hashes(session: Session, ranges: list[tuple[int, int]]) -> list[bytes]:
    found = node_hashes(session, merkle.nodes_for_ranges(ranges))
    return [merkle.fold([found[n] for n in merkle.range_nodes(a, b)]) for a, b in ranges]


def root_at(session: Session, size: int) -> bytes:
    """The RFC 6962 root of the first `size` events."""
    _check_size(session, size)
    if size == 0:
        return merkle.EMPTY_ROOT
    return _range_hashes(session, [(0, size)])[0]


def inclusion_proof(session: Session, index: int, size: int) -> list[bytes]:
    """Audit path of event `index` in the tree of `size` events (leaf to root)."""
    _check_size(session, size)
    return _range_hashes(session, merkle.inclusion_ranges(index, size))


def consistency_proof(session: Session, size1: int, size2: int) -> list[bytes]:
    """RFC 6962 proof that the tree of size1 is a prefix of the tree of size2."""
    _check_size(session, size2)
    return _range_hashes(session, merkle.consistency_ranges(size1, size2))


def head_root(session: Session) -> tuple[int, bytes]:
    """(size, root) of the whole log from the head row alone."""
    row = session.connection().execute(select(_head.c.size, _head.c.frontier).where(_head.c.id == HEAD_ID)).one()
    return int(row.size), merkle.fold([bytes.fromhex(h) for h in row.frontier])


# --- reading events ---------------------------------------------------------------------------------


def list_events(
    session: Session,
    *,
    tenant: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: int | None = None,
    limit: int = 100,
    actor: str | None = None,
    actor_tenant: str | None = None,
    newest_first: bool = False,
) -> list[AuditEvent]:
    """Events in sequence order (newest first with `newest_first`), filtered; `after` is the last sequence number
    of the previous page (in that order: with `newest_first`, the events before it). `actor` and `actor_tenant` as
    actor_filter has them."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise InvalidAuditEvent(f"{name} must carry a timezone")
    if not 1 <= limit <= 10_000:
        raise InvalidAuditEvent("limit must be between 1 and 10000")
    seq = col(AuditEvent.seq)
    stmt = sm_select(AuditEvent).order_by(seq.desc() if newest_first else seq).limit(limit)
    if tenant is not None:
        stmt = stmt.where(col(AuditEvent.tenant) == tenant)
    if action is not None:
        stmt = stmt.where(col(AuditEvent.action) == action)
    if actor is not None or actor_tenant is not None:
        stmt = stmt.where(actor_filter(actor, actor_tenant))
    if since is not None:  # in UTC: SQLite keeps times as UTC text without an offset
        stmt = stmt.where(col(AuditEvent.ts) >= since.astimezone(UTC))
    if until is not None:
        stmt = stmt.where(col(AuditEvent.ts) < until.astimezone(UTC))
    if after is not None:
        stmt = stmt.where(seq < after if newest_first else seq > after)
    return list(session.exec(stmt).all())


def actor_filter(actor: str | None, actor_tenant: str | None = None) -> Any:
    """The SQL condition selecting the events of an actor as audit.actor.ActorQuery defines it (`alice@acme`: acme's
    alice; `alice`: every tenant's alice and of none; `actor_tenant`: within that tenant); InvalidAuditEvent for
    no such filter."""
    query = ActorQuery(actor, actor_tenant)
    problem = query.problem()
    if problem is not None:
        raise InvalidAuditEvent(problem)
    ev = _events.c
    return or_(*[
        and_(*([] if m.id is None else [ev.actor_id == m.id]),
             *([] if m.any_tenant else [ev.actor_tenant == m.tenant if m.tenant is not None
                                        else ev.actor_tenant.is_(None)]))
        for m in query.alternatives])


def get_event(session: Session, seq: int) -> AuditEvent | None:
    return session.get(AuditEvent, seq)
