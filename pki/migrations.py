"""PKI schema steps, frozen (the rule: store/migrations.py)."""

from __future__ import annotations

import sqlalchemy as sa

from store.migrations import Migration

_v3 = sa.MetaData()
_TABLES_V1 = (
    sa.Table(
        "pki_settings",
        _v3,
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=False, nullable=False),
        sa.Column('trust_domain', sa.String(255), nullable=False),
        sa.Column('key_kind', sa.String(16), nullable=False),
        sa.Column('ca_ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('svid_default_ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('svid_max_ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('jwt_default_ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('jwt_max_ttl_seconds', sa.Integer(), nullable=False),
        sa.Column('bundle_sequence', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    ),
    sa.Table(
        "pki_cas",
        _v3,
        sa.Column('id', sa.String(64), primary_key=True, nullable=False),
        sa.Column('generation', sa.Integer(), nullable=False, index=True),
        sa.Column('role', sa.String(16), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('parent_id', sa.String(64), nullable=True),
        sa.Column('key_id', sa.String(128), nullable=False),
        sa.Column('key_kind', sa.String(16), nullable=False),
        sa.Column('jwt_key_id', sa.String(128), nullable=True),
        sa.Column('jwt_kid', sa.String(64), nullable=True),
        sa.Column('jwt_public_pem', sa.Text(), nullable=True),
        sa.Column('not_before', sa.DateTime(timezone=True), nullable=False),
        sa.Column('not_after', sa.DateTime(timezone=True), nullable=False),
        sa.Column('cert_pem', sa.Text(), nullable=False),
        sa.Column('signed_until', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('activated_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True),
        sa.Index('ix_pki_cas_state_role', 'state', 'role'),
    ),
    sa.Table(
        "pki_svids",
        _v3,
        sa.Column('serial', sa.String(64), primary_key=True, nullable=False),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('spiffe_id', sa.String(2048), nullable=False, index=True),
        sa.Column('tenant', sa.String(63), nullable=True),
        sa.Column('group', sa.String(63), nullable=True),
        sa.Column('workload', sa.String(63), nullable=True),
        sa.Column('node', sa.String(63), nullable=True),
        sa.Column('issuer_ca_id', sa.String(64), nullable=False, index=True),
        sa.Column('not_before', sa.DateTime(timezone=True), nullable=False),
        sa.Column('not_after', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revocation_reason', sa.String(500), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Index('ix_pki_svids_identity', 'tenant', 'group', 'workload'),
        sa.Index('ix_pki_svids_revoked', 'revoked_at'),
    ),
    sa.Table(
        "pki_revoked_identities",
        _v3,
        sa.Column('id', sa.Integer(), primary_key=True, nullable=False),
        sa.Column('spiffe_id_prefix', sa.String(2048), nullable=False, unique=True),
        sa.Column('tenant', sa.String(63), nullable=False, index=True),
        sa.Column('group', sa.String(63), nullable=True),
        sa.Column('workload', sa.String(63), nullable=True),
        sa.Column('reason', sa.String(500), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_by', sa.String(512), nullable=False),
    ),
    sa.Table(
        "pki_join_tokens",
        _v3,
        sa.Column('token_hash', sa.String(64), primary_key=True, nullable=False),
        sa.Column('node_name', sa.String(63), nullable=False, index=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('used_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_by', sa.String(512), nullable=False),
    ),
)


def _step_3(conn: sa.Connection) -> None:
    _v3.create_all(conn)


STEPS: tuple[Migration, ...] = (
    Migration(3, 'pki: CAs, SVIDs, revocations, join tokens', _step_3),
)
