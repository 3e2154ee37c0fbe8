"""API token schema steps, frozen: each step holds the DDL it ran when it landed, written out here as its own
tables (never derived from the models, which grow), so a database migrated a year ago and one migrated
today have the same history. A schema change is a new step appended below; tests/store/test_migrations.py
checks that the steps' result matches the models and that no landed step changed. store/ runs them."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    MetaData,
    String,
    Table,
)

from store.migrations import Migration

_v5 = MetaData()
_TABLES_V1 = (
    Table(
        "api_tokens",
        _v5,
        Column('id', String(64), primary_key=True, nullable=False),
        Column('token_hash', String(64), nullable=True, unique=True),
        Column('role', String(32), nullable=False),
        Column('tenant', String(63), nullable=True),
        Column('subject', String(512), nullable=False),
        Column('description', String(200), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Column('expires_at', DateTime(timezone=True), nullable=True),
        Column('revoked_at', DateTime(timezone=True), nullable=True),
    ),

)


def _step_5(conn: Connection) -> None:
    _v5.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(5, 'api: API tokens and principals', _step_5),
)
