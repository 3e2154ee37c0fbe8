"""API token schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v5 = sa.MetaData()
_TABLES_V1 = (
    sa.Table(
        "api_tokens",
        _v5,
        sa.Column('id', sa.String(64), primary_key=True, nullable=False),
        sa.Column('token_hash', sa.String(64), nullable=True, unique=True),
        sa.Column('role', sa.String(32), nullable=False),
        sa.Column('tenant', sa.String(63), nullable=True),
        sa.Column('subject', sa.String(512), nullable=False),
        sa.Column('description', sa.String(200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    ),
)


def _step_5(conn: sa.Connection) -> None:
    _v5.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(5, 'api: API tokens and principals', _step_5),
)
