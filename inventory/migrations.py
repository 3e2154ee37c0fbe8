"""Inventory schema steps, frozen: each step holds the DDL it ran when it landed, written out here as its own
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
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

from store.migrations import Migration

_v2 = MetaData()
_TABLES_V1 = (
    Table(
        "tenants",
        _v2,
        Column('slug', String(63), primary_key=True, nullable=False),
        Column('display_name', String(200), nullable=False),
        Column('l3vni', Integer(), nullable=True, unique=True),
        Column('prefix', String(64), nullable=True),
        Column('quarantined', Boolean(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
    ),
    Table(
        "workload_groups",
        _v2,
        Column('id', Integer(), primary_key=True, nullable=False),
        Column('tenant', String(63), ForeignKey('tenants.slug'), nullable=False, index=True),
        Column('name', String(63), nullable=False),
        Column('labels', JSON(), nullable=False),
        Column('ports', JSON(), nullable=False),
        Column('sensitivity', String(16), nullable=False),
        Column('quarantined', Boolean(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
        UniqueConstraint('tenant', 'name'),
    ),
    Table(
        "workloads",
        _v2,
        Column('id', Integer(), primary_key=True, nullable=False),
        Column('tenant', String(63), ForeignKey('tenants.slug'), nullable=False, index=True),
        Column('group', String(63), nullable=False),
        Column('name', String(63), nullable=False),
        Column('spiffe_id', String(2048), nullable=False, unique=True),
        Column('revoked', Boolean(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
        UniqueConstraint('tenant', 'group', 'name'),
    ),

)


def _step_2(conn: Connection) -> None:
    _v2.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(2, 'inventory: tenants, workload groups, workloads', _step_2),
)
