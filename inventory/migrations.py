"""Inventory schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v2 = sa.MetaData()
_TABLES_V1 = (
    sa.Table(
        "tenants",
        _v2,
        sa.Column('slug', sa.String(63), primary_key=True, nullable=False),
        sa.Column('display_name', sa.String(200), nullable=False),
        sa.Column('l3vni', sa.Integer(), nullable=True, unique=True),
        sa.Column('prefix', sa.String(64), nullable=True),
        sa.Column('quarantined', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
    sa.Table(
        "workload_groups",
        _v2,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('tenant', sa.String(63), sa.ForeignKey('tenants.slug'), nullable=False, index=True),
        sa.Column('name', sa.String(63), nullable=False),
        sa.Column('labels', sa.JSON(), nullable=False),
        sa.Column('ports', sa.JSON(), nullable=False),
        sa.Column('sensitivity', sa.String(16), nullable=False),
        sa.Column('quarantined', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('tenant', 'name'),
    ),
    sa.Table(
        "workloads",
        _v2,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('tenant', sa.String(63), sa.ForeignKey('tenants.slug'), nullable=False, index=True),
        sa.Column('group', sa.String(63), nullable=False),
        sa.Column('name', sa.String(63), nullable=False),
        sa.Column('spiffe_id', sa.String(2048), nullable=False, unique=True),
        sa.Column('revoked', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('tenant', 'group', 'name'),
    ),
)


def _step_2(conn: sa.Connection) -> None:
    _v2.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(2, 'inventory: tenants, workload groups, workloads', _step_2),
)
