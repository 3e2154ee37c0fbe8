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


_v16 = sa.MetaData()
_TABLES_V16 = (
    sa.Table(
        "deployment",
        _v16,
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=False, nullable=False),
        sa.Column('deployment_id', sa.String(32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
)


def _step_16(conn: sa.Connection) -> None:
    """The deployment id (one row, written once by init: keys/deployment.py) that marks the keys this database makes in
    a PKCS#11 token, so that a start removes its own unused CA keys there and never another deployment's."""
    _v16.create_all(conn)


_v17 = sa.MetaData()
_TABLES_V17 = (
    sa.Table(
        "key_intents",
        _v17,
        sa.Column('key_id', sa.String(128), primary_key=True, nullable=False),
        sa.Column('deployment_id', sa.String(32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
)


def _step_17(conn: sa.Connection) -> None:
    """The keys this database is about to make in a PKCS#11 token (keys/intents.py), committed before they are made:
    a start destroys an unused CA key of this deployment only when a row here names it, never a key a restored backup
    has no record of."""
    _v17.create_all(conn)


_v18 = sa.MetaData()  # no table: a column (below)
_added_v18: dict[str, tuple[sa.Column[object], ...]] = {
    "deployment": (sa.Column('origin', sa.String(16), nullable=True),),
}

# The deployment row of a database whose trust domain was made before its deployment id (the `ca.init` event comes
# before any `deployment.create` event): an upgraded one, whose keys carry no marker. Else marker-born.
_ORIGIN_V18 = (
    "CASE WHEN EXISTS (SELECT 1 FROM audit_events i WHERE i.action = 'ca.init' AND NOT EXISTS ("
    "SELECT 1 FROM audit_events d WHERE d.action = 'deployment.create' AND d.seq < i.seq)) "
    "THEN 'upgrade' ELSE 'init' END"
)


def _step_18(conn: sa.Connection) -> None:
    """Where a deployment came from (keys/deployment.py): only one whose keys predate markers may use an unmarked key
    of a label it looks up; one init made with markers never does (an unmarked `audit-checkpoint` key planted in the
    token before its first init signed its checkpoints). Existing rows are told apart by the audit log's order: a
    trust domain made (`ca.init`) before the deployment id (`deployment.create`) is an upgrade."""
    for table, columns in _added_v18.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")
    conn.exec_driver_sql(f"UPDATE deployment SET origin = {_ORIGIN_V18}")  # noqa: S608 (constant SQL)


_v19 = sa.MetaData()
_TABLES_V19 = (
    sa.Table(
        "adopted_keys",
        _v19,
        sa.Column('key_id', sa.String(128), primary_key=True, nullable=False),
        sa.Column('spki_sha256', sa.String(64), nullable=False),
        sa.Column('adopted_at', sa.DateTime(timezone=True), nullable=False),
    ),
)
_added_v19: dict[str, tuple[sa.Column[object], ...]] = {
    "deployment": (sa.Column('adopted_at', sa.DateTime(timezone=True), nullable=True),),
}


def _step_19(conn: sa.Connection) -> None:
    """The unmarked keys an upgraded deployment adopts (keys/adoption.py), and when: until then it used any unmarked
    key of a label it had no marked key of, for ever and for any label, so whoever could write an unmarked object
    into the token could have it sign with their key. The step adopts nothing (a migration cannot reach the token):
    the deployment's next start records what it uses."""
    _v19.create_all(conn)
    for table, columns in _added_v19.items():
        for column in columns:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")


STEPS: tuple[Migration, ...] = (
    Migration(13, 'keys: encrypted key files shared by replicas', _step_13),
    Migration(16, "keys: the deployment id that marks this database's keys in a PKCS#11 token", _step_16),
    Migration(17, "keys: the keys this database is about to make in a PKCS#11 token", _step_17),
    Migration(18, "keys: whether a deployment's keys predate markers (only then may it use an unmarked key)",
              _step_18),
    Migration(19, "keys: the unmarked keys an upgraded deployment adopts (only those does it use)", _step_19),
)
