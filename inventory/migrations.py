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


_v10 = sa.MetaData()
_TABLES_V10 = (
    sa.Table(
        "fabric_nodes",
        _v10,
        sa.Column('name', sa.String(63), primary_key=True, nullable=False),
        sa.Column('uplinks', sa.JSON(), nullable=False),
        sa.Column('host_ports', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
    sa.Table(
        "fabric_switches",
        _v10,
        sa.Column('name', sa.String(63), primary_key=True, nullable=False),
        sa.Column('role', sa.String(8), nullable=False),
        sa.Column('ports', sa.JSON(), nullable=False),
        sa.Column('model', sa.String(63), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
    sa.Table(
        "fabric_links",
        _v10,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('leaf', sa.String(63), nullable=False),
        sa.Column('leaf_port', sa.String(63), nullable=False),
        sa.Column('peer', sa.String(63), nullable=False),
        sa.Column('peer_port', sa.String(63), nullable=False),
        sa.Column('peer_kind', sa.String(8), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('leaf', 'leaf_port'),
        sa.UniqueConstraint('peer', 'peer_port'),
    ),
    sa.Table(
        "fabric_placements",
        _v10,
        sa.Column('workload', sa.String(191), primary_key=True, nullable=False),
        sa.Column('tenant', sa.String(63), nullable=False, index=True),
        sa.Column('node', sa.String(63), nullable=False, index=True),
        sa.Column('port', sa.String(63), nullable=False),
        sa.Column('ipv4', sa.String(15), nullable=True, unique=True),
        sa.Column('ipv6', sa.String(39), nullable=True, unique=True),
        sa.Column('selectors', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('node', 'port'),
    ),
)
# Columns step 10 adds to a table an earlier step made (tests/store/test_migrations.py reads this name).
_added_v10: dict[str, tuple[sa.Column[object], ...]] = {
    "tenants": (
        sa.Column('vlan', sa.Integer(), nullable=True, unique=True, index=True),
        sa.Column('prefix6', sa.String(64), nullable=True),
    ),
}


def _step_10(conn: sa.Connection) -> None:
    """The fabric inventory (nodes, switches, links, placements); tenants gain their attachment VLAN (also
    their conntrack zone) and an IPv6 prefix. Existing tenants get them allocated when first needed."""
    _v10.create_all(conn)
    for table, columns in _added_v10.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")
    conn.exec_driver_sql("CREATE UNIQUE INDEX ix_tenants_vlan ON tenants (vlan)")


STEPS: tuple[Migration, ...] = (
    Migration(2, 'inventory: tenants, workload groups, workloads', _step_2),
    Migration(10, 'inventory: the fabric (nodes, switches, links, placements); tenant VLAN and IPv6 prefix', _step_10),
)
