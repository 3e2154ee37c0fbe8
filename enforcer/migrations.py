"""Enforcer schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v11 = sa.MetaData()
_TABLES_V11 = (
    sa.Table(
        "enforcer_rulesets",
        _v11,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('device', sa.String(80), nullable=False, index=True),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('content_hash', sa.String(64), nullable=False),
        sa.Column('ir', sa.Text(), nullable=False),
        sa.Column('cause', sa.String(500), nullable=False),
        sa.Column('published_by', sa.String(512), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('device', 'version'),
    ),
    sa.Table(
        "enforcer_devices",
        _v11,
        sa.Column('device', sa.String(80), primary_key=True, nullable=False),
        sa.Column('kind', sa.String(8), nullable=False),
        sa.Column('in_fabric', sa.Boolean(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('content_hash', sa.String(64), nullable=True),
        sa.Column('pinned', sa.Boolean(), nullable=False),
        sa.Column('pending_hash', sa.String(64), nullable=True),
        sa.Column('applied_version', sa.Integer(), nullable=True),
        sa.Column('applied_hash', sa.String(64), nullable=True),
        sa.Column('applied_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('drift', sa.JSON(), nullable=False),
        sa.Column('drift_repaired', sa.Boolean(), nullable=False),
        sa.Column('last_error', sa.String(2000), nullable=True),
        sa.Column('counters', sa.JSON(), nullable=False),
        sa.Column('reported_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    ),
)


def _step_11(conn: sa.Connection) -> None:
    _v11.create_all(conn)


_v20 = sa.MetaData()  # no table of its own
_added_v20: dict[str, tuple[sa.Column[object], ...]] = {
    "enforcer_devices": (sa.Column('report_seq', sa.BigInteger(), nullable=True),),
}


def _step_20(conn: sa.Connection) -> None:
    """The highest sequence number of a device's stored status report (enforcer/service.py record_status): a
    report the network delayed past a newer one (a timed-out request processed after its retry, an old agent
    process's last report) no longer overwrites it. Existing rows keep NULL: their reports were not numbered."""
    for table, columns in _added_v20.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")


STEPS: tuple[Migration, ...] = (
    Migration(11, 'enforcer: versioned rule sets per device, device state and status', _step_11),
    Migration(20, "enforcer: a status report's sequence number (a late, older report changes nothing)", _step_20),
)
