"""Audit log schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v1 = sa.MetaData()
_TABLES_V1 = (
    sa.Table(
        "audit_events",
        _v1,
        sa.Column(
            'seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), primary_key=True, autoincrement=False,
            nullable=False,
        ),
        sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor_id', sa.String(512), nullable=False),
        sa.Column('actor_kind', sa.String(32), nullable=False),
        sa.Column('tenant', sa.String(63), nullable=True),
        sa.Column('action', sa.String(64), nullable=False),
        sa.Column('object_type', sa.String(64), nullable=False),
        sa.Column('object_id', sa.String(512), nullable=False),
        sa.Column('summary', sa.JSON(), nullable=False),
        sa.Column('reason', sa.String(2000), nullable=True),
        sa.Column('request_id', sa.String(128), nullable=True),
        sa.Column('prev_hash', sa.String(64), nullable=False),
        sa.Column('leaf_hash', sa.String(64), nullable=False),
        sa.Column('data', sa.Text(), nullable=False),
        sa.Index('ix_audit_events_action_seq', 'action', 'seq'),
        sa.Index('ix_audit_events_tenant_seq', 'tenant', 'seq'),
        sa.Index('ix_audit_events_ts', 'ts'),
    ),
    sa.Table(
        "audit_nodes",
        _v1,
        sa.Column(
            'key', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), primary_key=True, autoincrement=False,
            nullable=False,
        ),
        sa.Column('hash', sa.LargeBinary(32), nullable=False),
    ),
    sa.Table(
        "audit_head",
        _v1,
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=False, nullable=False),
        sa.Column('size', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('last_leaf', sa.String(64), nullable=False),
        sa.Column('frontier', sa.JSON(), nullable=False),
    ),
    sa.Table(
        "audit_checkpoints",
        _v1,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('size', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False, unique=True),
        sa.Column('root_hash', sa.String(64), nullable=False),
        sa.Column('origin', sa.String(255), nullable=False),
        sa.Column('key_name', sa.String(255), nullable=False),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
)


def _step_1(conn: sa.Connection) -> None:
    _v1.create_all(conn)
    # the head row exists from the moment the table does, so appends only ever lock it
    conn.execute(_TABLES_V1[2].insert().values(id=1, size=0, last_leaf="0" * 64, frontier=[]))


_v6 = sa.MetaData()
_COUNTERS_V6 = sa.Table(
    "audit_counters",
    _v6,
    sa.Column('key', sa.String(200), primary_key=True, nullable=False),
    sa.Column('count', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('last_leaf', sa.String(64), nullable=False),
)
# Columns step 6 adds to a table an earlier step made (tests/store/test_migrations.py reads this name).
_added_v6: dict[str, tuple[sa.Column[object], ...]] = {
    "audit_head": (
        sa.Column('last_ts', sa.DateTime(timezone=True), nullable=True),
        sa.Column('counted_from', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    ),
}


def _step_6(conn: sa.Connection) -> None:
    """Audit events v2: per-key counters (audit/counters.py) and a clock that never goes back. Existing
    events stay version 1: `counted_from` is where counted events begin (0 on a new log), `last_ts` the
    latest time any existing event has."""
    _v6.create_all(conn)
    for table, columns in _added_v6.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")
    conn.exec_driver_sql("UPDATE audit_head SET last_ts = (SELECT max(ts) FROM audit_events), counted_from = size")


_v12 = sa.MetaData()  # no table: a function (tests/store/test_migrations.py reads this name)


def _step_12(conn: sa.Connection) -> None:
    """PostgreSQL: the head's lock and what a writer reads with it, in one call (audit/service.py `_locked_head`).
    One statement cannot do both exactly in READ COMMITTED: its snapshot is taken before it waits for the lock, so
    when another writer commits meanwhile its counters and its scan are stale, and a second statement read them
    again (most batches, with several replicas writing). A volatile function's statements each take a snapshot of
    their own: the second one is taken with the lock held, after every earlier writer committed. Arguments: the
    counter keys, and the scan (from `since`, the first event whose action is neither one of `exact` nor LIKE one of
    `patterns`, prefixes with their LIKE characters escaped; no scan when `since` is null; both are array operators,
    no subquery per event scanned). SQLite takes its writer lock at BEGIN: nothing to do."""
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql("""
CREATE FUNCTION tf_lock_audit_head(p_keys text[], p_since bigint, p_exact text[], p_patterns text[])
RETURNS TABLE (o_size bigint, o_last_leaf text, o_frontier json, o_last_ts timestamptz, o_unsettling text,
               o_key text, o_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1 FROM audit_head h WHERE h.id = 1 FOR UPDATE;
    RETURN QUERY
    SELECT h.size::bigint, h.last_leaf::text, h.frontier::json, h.last_ts,
           CASE WHEN p_since IS NULL THEN NULL ELSE (
               SELECT e.action::text FROM audit_events e
               WHERE e.seq >= p_since AND NOT (e.action = ANY(p_exact) OR e.action LIKE ANY(p_patterns))
               ORDER BY e.seq LIMIT 1) END,
           c.key::text, c.count::bigint
    FROM audit_head h LEFT OUTER JOIN audit_counters c ON c.key = ANY(p_keys)
    WHERE h.id = 1;
END
$$""")


_v15 = sa.MetaData()  # no table of its own
_added_v15: dict[str, tuple[sa.Column[object], ...]] = {
    "audit_events": (sa.Column('actor_tenant', sa.String(63), nullable=True),),
}


def _step_15(conn: sa.Connection) -> None:
    """An event's actor names its tenant (audit/actor.py): the column that filters by it. Existing events keep NULL,
    never a backfill: their hashed bytes carry no actor tenant, and the column is part of what rebuilds them
    (audit/service.py `event_document`); which tenant an old `alice` belonged to is not in the log to be had."""
    for table, columns in _added_v15.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")


STEPS: tuple[Migration, ...] = (
    Migration(1, 'audit log', _step_1),
    Migration(6, 'audit: per-key event counters and a monotonic clock (events v2)', _step_6),
    Migration(12, "audit: the head's lock and the reads under it in one call (PostgreSQL)", _step_12),
    Migration(15, "audit: an event's actor names its tenant", _step_15),
)
