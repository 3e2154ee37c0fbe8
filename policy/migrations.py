"""Policy schema steps, frozen: each step holds the DDL it ran when it landed, written out here as its own
tables (never derived from the models, which grow), so a database migrated a year ago and one migrated
today have the same history. A schema change is a new step appended below; tests/store/test_migrations.py
checks that the steps' result matches the models and that no landed step changed. store/ runs them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

from store.migrations import Migration

_v4 = MetaData()
_TABLES_V1 = (
    Table(
        "grants",
        _v4,
        Column('id', String(36), primary_key=True, nullable=False),
        Column('src_tenant', String(63), nullable=False, index=True),
        Column('src_group', String(63), nullable=False),
        Column('dst_tenant', String(63), nullable=False, index=True),
        Column('dst_group', String(63), nullable=False),
        Column('proto', String(8), nullable=False),
        Column('ports', JSON(), nullable=False),
        Column('justification', String(2000), nullable=False),
        Column('ttl_seconds', Integer(), nullable=False),
        Column('state', String(16), nullable=False, index=True),
        Column('requested_by', String(512), nullable=False),
        Column('idempotency_key', String(128), nullable=True),
        Column('required_approvers', JSON(), nullable=False),
        Column('approvals', JSON(), nullable=False),
        Column('reasons', JSON(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Column('decided_at', DateTime(timezone=True), nullable=True),
        Column('expires_at', DateTime(timezone=True), nullable=True),
        Column('pending_until', DateTime(timezone=True), nullable=True),
        Column('version', Integer(), nullable=False),
        UniqueConstraint('requested_by', 'idempotency_key'),
    ),
    Table(
        "policy_versions",
        _v4,
        Column('number', Integer(), primary_key=True, nullable=False),
        Column('content_hash', String(64), nullable=False, unique=True),
        Column('modules', JSON(), nullable=False),
        Column('tests', JSON(), nullable=False),
        Column('tests_passed', Boolean(), nullable=False),
        Column('state', String(16), nullable=False, index=True),
        Column('uploaded_by', String(512), nullable=False),
        Column('note', String(2000), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Column('activated_at', DateTime(timezone=True), nullable=True),
        Column('signature', String(512), nullable=True),
        Column('signed_by', String(128), nullable=True),
    ),
    Table(
        "policy_decisions",
        _v4,
        Column('id', Integer(), primary_key=True, nullable=False),
        Column('ts', DateTime(timezone=True), nullable=False, index=True),
        Column('kind', String(16), nullable=False),
        Column('tenant', String(63), nullable=True, index=True),
        Column('allowed', Boolean(), nullable=False),
        Column('outcome', String(16), nullable=False),
        Column('input', JSON(), nullable=False),
        Column('result', JSON(), nullable=False),
        Column('reasons', JSON(), nullable=False),
        Column('policy_hash', String(64), nullable=True),
        Index('ix_policy_decisions_kind_ts', 'kind', 'ts'),
    ),

)


def _step_4(conn: Connection) -> None:
    _v4.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(4, 'policy: grants, policy versions, decision log', _step_4),
)
