"""Audit log schema steps, frozen: each step holds the DDL it ran when it landed, written out here as its own
tables (never derived from the models, which grow), so a database migrated a year ago and one migrated
today have the same history. A schema change is a new step appended below; tests/store/test_migrations.py
checks that the steps' result matches the models and that no landed step changed. store/ runs them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from store.migrations import Migration

_v1 = MetaData()
_TABLES_V1 = (
    Table(
        "audit_events",
        _v1,
        Column(
            'seq', BigInteger().with_variant(Integer(), 'sqlite'), primary_key=True, autoincrement=False, nullable=False
        ),
        Column('ts', DateTime(timezone=True), nullable=False),
        Column('actor_id', String(512), nullable=False),
        Column('actor_kind', String(32), nullable=False),
        Column('tenant', String(63), nullable=True),
        Column('action', String(64), nullable=False),
        Column('object_type', String(64), nullable=False),
        Column('object_id', String(512), nullable=False),
        Column('summary', JSON(), nullable=False),
        Column('reason', String(2000), nullable=True),
        Column('request_id', String(128), nullable=True),
        Column('prev_hash', String(64), nullable=False),
        Column('leaf_hash', String(64), nullable=False),
        Column('data', Text(), nullable=False),
        Index('ix_audit_events_action_seq', 'action', 'seq'),
        Index('ix_audit_events_tenant_seq', 'tenant', 'seq'),
        Index('ix_audit_events_ts', 'ts'),
    ),
    Table(
        "audit_nodes",
        _v1,
        Column(
            'key', BigInteger().with_variant(Integer(), 'sqlite'), primary_key=True, autoincrement=False, nullable=False
        ),
        Column('hash', LargeBinary(32), nullable=False),
    ),
    Table(
        "audit_head",
        _v1,
        Column('id', Integer(), primary_key=True, autoincrement=False, nullable=False),
        Column('size', BigInteger().with_variant(Integer(), 'sqlite'), nullable=False),
        Column('last_leaf', String(64), nullable=False),
        Column('frontier', JSON(), nullable=False),
    ),
    Table(
        "audit_checkpoints",
        _v1,
        Column('id', Integer(), primary_key=True, nullable=False),
        Column('size', BigInteger().with_variant(Integer(), 'sqlite'), nullable=False, unique=True),
        Column('root_hash', String(64), nullable=False),
        Column('origin', String(255), nullable=False),
        Column('key_name', String(255), nullable=False),
        Column('note', Text(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
    ),

)


def _step_1(conn: Connection) -> None:
    _v1.create_all(conn)
    # the head row exists from the moment the table does, so appends only ever lock it
    conn.execute(_TABLES_V1[2].insert().values(id=1, size=0, last_leaf="0" * 64, frontier=[]))


STEPS: tuple[Migration, ...] = (
    Migration(1, 'audit log', _step_1),
)
