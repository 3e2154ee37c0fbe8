"""PKI schema steps, frozen: each step holds the DDL it ran when it landed, written out here as its own
tables (never derived from the models, which grow), so a database migrated a year ago and one migrated
today have the same history. A schema change is a new step appended below; tests/store/test_migrations.py
checks that the steps' result matches the models and that no landed step changed. store/ runs them."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from store.migrations import Migration

_v3 = MetaData()
_TABLES_V1 = (
    Table(
        "pki_settings",
        _v3,
        Column('id', Integer(), primary_key=True, autoincrement=False, nullable=False),
        Column('trust_domain', String(255), nullable=False),
        Column('key_kind', String(16), nullable=False),
        Column('ca_ttl_seconds', Integer(), nullable=False),
        Column('svid_default_ttl_seconds', Integer(), nullable=False),
        Column('svid_max_ttl_seconds', Integer(), nullable=False),
        Column('jwt_default_ttl_seconds', Integer(), nullable=False),
        Column('jwt_max_ttl_seconds', Integer(), nullable=False),
        Column('bundle_sequence', Integer(), nullable=False),
        Column('created_at', DateTime(timezone=True), nullable=False),
    ),
    Table(
        "pki_cas",
        _v3,
        Column('id', String(64), primary_key=True, nullable=False),
        Column('generation', Integer(), nullable=False, index=True),
        Column('role', String(16), nullable=False),
        Column('state', String(16), nullable=False),
        Column('parent_id', String(64), nullable=True),
        Column('key_id', String(128), nullable=False),
        Column('key_kind', String(16), nullable=False),
        Column('jwt_key_id', String(128), nullable=True),
        Column('jwt_kid', String(64), nullable=True),
        Column('jwt_public_pem', Text(), nullable=True),
        Column('not_before', DateTime(timezone=True), nullable=False),
        Column('not_after', DateTime(timezone=True), nullable=False),
        Column('cert_pem', Text(), nullable=False),
        Column('signed_until', DateTime(timezone=True), nullable=True),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Column('activated_at', DateTime(timezone=True), nullable=True),
        Column('retired_at', DateTime(timezone=True), nullable=True),
        Index('ix_pki_cas_state_role', 'state', 'role'),
    ),
    Table(
        "pki_svids",
        _v3,
        Column('serial', String(64), primary_key=True, nullable=False),
        Column('kind', String(16), nullable=False),
        Column('spiffe_id', String(2048), nullable=False, index=True),
        Column('tenant', String(63), nullable=True),
        Column('group', String(63), nullable=True),
        Column('workload', String(63), nullable=True),
        Column('node', String(63), nullable=True),
        Column('issuer_ca_id', String(64), nullable=False, index=True),
        Column('not_before', DateTime(timezone=True), nullable=False),
        Column('not_after', DateTime(timezone=True), nullable=False),
        Column('revoked_at', DateTime(timezone=True), nullable=True),
        Column('revocation_reason', String(500), nullable=True),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Index('ix_pki_svids_identity', 'tenant', 'group', 'workload'),
        Index('ix_pki_svids_revoked', 'revoked_at'),
    ),
    Table(
        "pki_revoked_identities",
        _v3,
        Column('id', Integer(), primary_key=True, nullable=False),
        Column('spiffe_id_prefix', String(2048), nullable=False, unique=True),
        Column('tenant', String(63), nullable=False, index=True),
        Column('group', String(63), nullable=True),
        Column('workload', String(63), nullable=True),
        Column('reason', String(500), nullable=False),
        Column('revoked_at', DateTime(timezone=True), nullable=False),
        Column('revoked_by', String(512), nullable=False),
    ),
    Table(
        "pki_join_tokens",
        _v3,
        Column('token_hash', String(64), primary_key=True, nullable=False),
        Column('node_name', String(63), nullable=False, index=True),
        Column('created_at', DateTime(timezone=True), nullable=False),
        Column('expires_at', DateTime(timezone=True), nullable=False),
        Column('used_at', DateTime(timezone=True), nullable=True),
        Column('created_by', String(512), nullable=False),
    ),

)


def _step_3(conn: Connection) -> None:
    _v3.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(3, 'pki: CAs, SVIDs, revocations, join tokens', _step_3),
)
