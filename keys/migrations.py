"""Key store schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v13 = sa.MetaData()
_TABLES_V13 = (
    sa.Table(
        "key_blobs",
        _v13,
        sa.Column('key_id', sa.String(128), primary_key=True, nullable=False),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('blob', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
)


def _step_13(conn: sa.Connection) -> None:
    """The encrypted key files replicas share (keys/shared.py), so a key one replica generates (a CA rotation's)
    signs on every replica holding the master key."""
    _v13.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(13, 'keys: encrypted key files shared by replicas', _step_13),
)
