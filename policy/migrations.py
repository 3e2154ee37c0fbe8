"""Policy schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

from store.migrations import Migration

_v4 = sa.MetaData()
_TABLES_V1 = (
    sa.Table(
        "grants",
        _v4,
        sa.Column('id', sa.String(36), primary_key=True, nullable=False),
        sa.Column('src_tenant', sa.String(63), nullable=False, index=True),
        sa.Column('src_group', sa.String(63), nullable=False),
        sa.Column('dst_tenant', sa.String(63), nullable=False, index=True),
        sa.Column('dst_group', sa.String(63), nullable=False),
        sa.Column('proto', sa.String(8), nullable=False),
        sa.Column('ports', sa.JSON(), nullable=False),
        sa.Column('justification', sa.String(2000), nullable=False),
        sa.Column('ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(16), nullable=False, index=True),
        sa.Column('requested_by', sa.String(512), nullable=False),
        sa.Column('idempotency_key', sa.String(128), nullable=True),
        sa.Column('required_approvers', sa.JSON(), nullable=False),
        sa.Column('approvals', sa.JSON(), nullable=False),
        sa.Column('reasons', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('pending_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.UniqueConstraint('requested_by', 'idempotency_key'),
    ),
    sa.Table(
        "policy_versions",
        _v4,
        sa.Column('number', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('content_hash', sa.String(64), nullable=False, unique=True),
        sa.Column('modules', sa.JSON(), nullable=False),
        sa.Column('tests', sa.JSON(), nullable=False),
        sa.Column('tests_passed', sa.Boolean(), nullable=False),
        sa.Column('state', sa.String(16), nullable=False, index=True),
        sa.Column('uploaded_by', sa.String(512), nullable=False),
        sa.Column('note', sa.String(2000), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('activated_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('signature', sa.String(512), nullable=True),
        sa.Column('signed_by', sa.String(128), nullable=True),
    ),
    sa.Table(
        "policy_decisions",
        _v4,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('ts', sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('tenant', sa.String(63), nullable=True, index=True),
        sa.Column('allowed', sa.Boolean(), nullable=False),
        sa.Column('outcome', sa.String(16), nullable=False),
        sa.Column('input', sa.JSON(), nullable=False),
        sa.Column('result', sa.JSON(), nullable=False),
        sa.Column('reasons', sa.JSON(), nullable=False),
        sa.Column('policy_hash', sa.String(64), nullable=True),
        sa.Index('ix_policy_decisions_kind_ts', 'kind', 'ts'),
    ),
)


def _step_4(conn: sa.Connection) -> None:
    _v4.create_all(conn)


_v9 = sa.MetaData()
_TABLES_V9 = (
    sa.Table(
        "policy_data_version",
        _v9,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('n', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    ),
)

# Every row change that policy.data.build_data can see bumps policy_data_version.n, in the changing
# transaction (table, columns build_data reads, the rows it reads as a WHEN condition or None).
_WATCHED_V9: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("tenants", ("slug", "quarantined"), None),
    ("workload_groups", ("tenant", "name", "labels", "ports", "sensitivity", "quarantined"), None),
    ("workloads", ("spiffe_id", "revoked"), "{row}.revoked"),
    ("pki_revoked_identities", ("spiffe_id_prefix", "tenant", '"group"', "workload"), None),
    ("grants", ("id", "src_tenant", "dst_tenant", "src_group", "dst_group", "proto", "ports", "state", "expires_at"),
     "{row}.state = 'active'"),
)


def _step_9(conn: sa.Connection) -> None:
    """A counter every change to the policy data bumps (triggers), so a kept data document is validated by
    reading one row instead of every row it was built from (issue 13, item 6)."""
    _v9.create_all(conn)
    conn.execute(_TABLES_V9[0].insert().values(id=1, n=0))
    bump = "UPDATE policy_data_version SET n = n + 1 WHERE id = 1"
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.exec_driver_sql("CREATE FUNCTION tf_policy_data_bump() RETURNS trigger LANGUAGE plpgsql AS "
                             f"$$ BEGIN {bump}; RETURN NULL; END $$")
    for table, columns, rows in _WATCHED_V9:
        for event, when in (("INSERT", rows and rows.format(row="NEW")),
                            ("UPDATE OF " + ", ".join(columns),
                             rows and f"{rows.format(row='OLD')} OR {rows.format(row='NEW')}"),
                            ("DELETE", rows and rows.format(row="OLD"))):
            name = f"tf_pdv_{table}_{event.split()[0].lower()}"
            if postgres:
                cond = f" WHEN ({when})" if when else ""
                conn.exec_driver_sql(f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW{cond} "
                                     "EXECUTE FUNCTION tf_policy_data_bump()")
            else:
                cond = f" WHEN {when}" if when else ""
                conn.exec_driver_sql(f"CREATE TRIGGER {name} AFTER {event} ON {table}{cond} BEGIN {bump}; END")


_v14 = sa.MetaData()
_TABLES_V14 = (
    sa.Table(  # the grants table as step 14 leaves it (the columns of step 4, then requester_tenant)
        "grants",
        _v14,
        sa.Column('id', sa.String(36), primary_key=True, nullable=False),
        sa.Column('src_tenant', sa.String(63), nullable=False, index=True),
        sa.Column('src_group', sa.String(63), nullable=False),
        sa.Column('dst_tenant', sa.String(63), nullable=False, index=True),
        sa.Column('dst_group', sa.String(63), nullable=False),
        sa.Column('proto', sa.String(8), nullable=False),
        sa.Column('ports', sa.JSON(), nullable=False),
        sa.Column('justification', sa.String(2000), nullable=False),
        sa.Column('ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(16), nullable=False, index=True),
        sa.Column('requested_by', sa.String(512), nullable=False),
        sa.Column('idempotency_key', sa.String(128), nullable=True),
        sa.Column('required_approvers', sa.JSON(), nullable=False),
        sa.Column('approvals', sa.JSON(), nullable=False),
        sa.Column('reasons', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('pending_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('requester_tenant', sa.String(63), nullable=False),
        sa.UniqueConstraint('requester_tenant', 'requested_by', 'idempotency_key',
                            name='uq_grants_requester_idempotency_key'),
    ),
)

# The requester's tenant of a grant already stored. Its grant.request event (written in the grant's transaction,
# never removed) names the actor's kind: `tenant` or `workload` for a principal confined to a tenant, whose grants
# have always had that tenant as their source (a tenant principal may request for its own groups only: the route
# and policy.grants refused any other src_tenant since grants landed); any other kind is a platform principal
# (''). A grant without that event (none is written so; only a hand-made row) counts as the platform's: its
# retry then misses it and requests anew, where a wrong tenant could hand it to a principal of that tenant.
_REQUESTER_TENANT_V14 = (
    "CASE WHEN id IN (SELECT object_id FROM audit_events WHERE action = 'grant.request' AND object_type = 'grant' "
    "AND actor_kind IN ('tenant', 'workload')) THEN src_tenant ELSE '' END")
_PG_OLD_UNIQUE_V14 = "grants_requested_by_idempotency_key_key"  # PostgreSQL's name for step 4's unnamed UNIQUE


def _step_14(conn: sa.Connection) -> None:
    """An Idempotency-Key is unique per (requester's tenant, requester, key), no longer per (requester, key): a
    principal's id is not unique across tenants (API token subjects are free text, so acme's and globex's `alice`
    are one id), and one tenant's key blocked, or answered with its grant, the same key of another tenant's
    same-named principal. The scope is never NULL ('' for a platform principal): NULLs are distinct in a UNIQUE
    constraint on both databases. Existing rows are backfilled (_REQUESTER_TENANT_V14); the old constraint
    was the stricter one, so no row can collide under the new one.

    PostgreSQL changes the table in place. SQLite cannot drop a constraint: the table is rebuilt (a new one,
    the rows copied, the old dropped, the new renamed: SQLite's own procedure for a schema change ALTER TABLE
    cannot make), its indexes made again, and the triggers the old one carried (step 9's tf_pdv_grants_*, the
    policy data version's) created again from the very SQL that made them, read before the old table took them
    away."""
    grants = _TABLES_V14[0]
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("ALTER TABLE grants ADD COLUMN requester_tenant VARCHAR(63) NOT NULL DEFAULT ''")
        conn.exec_driver_sql(f"UPDATE grants SET requester_tenant = {_REQUESTER_TENANT_V14}")  # noqa: S608
        conn.exec_driver_sql("ALTER TABLE grants ALTER COLUMN requester_tenant DROP DEFAULT")
        conn.exec_driver_sql(f"ALTER TABLE grants DROP CONSTRAINT {_PG_OLD_UNIQUE_V14}")
        conn.exec_driver_sql("ALTER TABLE grants ADD CONSTRAINT uq_grants_requester_idempotency_key "
                             "UNIQUE (requester_tenant, requested_by, idempotency_key)")
        return
    triggers = [sql for (sql,) in conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'grants' ORDER BY name")]
    conn.execute(CreateTable(grants.to_metadata(sa.MetaData(), name="grants_new")))  # its indexes below
    kept = ", ".join(c.name for c in grants.columns if c.name != "requester_tenant")
    conn.exec_driver_sql(f"INSERT INTO grants_new ({kept}, requester_tenant) "  # noqa: S608
                         f"SELECT {kept}, {_REQUESTER_TENANT_V14} FROM grants")
    conn.exec_driver_sql("DROP TABLE grants")  # its indexes and triggers with it
    conn.exec_driver_sql("ALTER TABLE grants_new RENAME TO grants")
    for index in sorted(grants.indexes, key=lambda i: str(i.name)):
        index.create(conn)
    for sql in triggers:
        conn.exec_driver_sql(sql)


STEPS: tuple[Migration, ...] = (
    Migration(4, 'policy: grants, policy versions, decision log', _step_4),
    Migration(9, 'policy: the policy data version, bumped by triggers on every change build_data can see', _step_9),
    Migration(14, "policy: a grant's Idempotency-Key scoped by its requester's tenant", _step_14),
)
