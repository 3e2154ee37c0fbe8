"""PKI tables: CA generations, issued SVIDs, revoked identities, join tokens, trust domain settings.

A CA *generation* is a root and its issuing CA, created, activated and retired together (SPIRE's
self-signed CA rotation, with an intermediate): the bundle publishes the roots of every generation
that is prepared, active or retiring; retiring a generation removes its root, so its SVIDs stop verifying.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, DateTime, Index, Text
from sqlmodel import Field, SQLModel

CA_ROLES = ("root", "issuing")
# prepared: published, not signing yet; active: signs; retiring: published until its last SVID expires.
CA_STATES = ("prepared", "active", "retiring", "retired")


def _ts(nullable: bool = False) -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=nullable)


class TrustDomainSettings(SQLModel, table=True):
    """One row (id=1): the trust domain and the lifetimes everything is issued with."""

    __tablename__ = "pki_settings"

    id: int = Field(default=1, primary_key=True)
    trust_domain: str = Field(max_length=255)
    key_kind: str = Field(max_length=16)
    ca_ttl_seconds: int
    svid_default_ttl_seconds: int
    svid_max_ttl_seconds: int
    jwt_default_ttl_seconds: int
    jwt_max_ttl_seconds: int
    bundle_sequence: int = Field(default=1)
    created_at: datetime = Field(sa_column=_ts())


class CertificateAuthority(SQLModel, table=True):
    __tablename__ = "pki_cas"
    __table_args__ = (Index("ix_pki_cas_state_role", "state", "role"),)

    id: str = Field(primary_key=True, max_length=64)  # "g<generation>-<role>"
    generation: int = Field(index=True)
    role: str = Field(max_length=16)  # root | issuing
    state: str = Field(max_length=16)  # prepared | active | retiring | retired
    parent_id: str | None = Field(default=None, max_length=64)
    key_id: str = Field(max_length=128)
    key_kind: str = Field(max_length=16)
    # issuing CAs also carry the generation's JWT-SVID signing key
    jwt_key_id: str | None = Field(default=None, max_length=128)
    jwt_kid: str | None = Field(default=None, max_length=64)
    jwt_public_pem: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    not_before: datetime = Field(sa_column=_ts())
    not_after: datetime = Field(sa_column=_ts())
    cert_pem: str = Field(sa_column=Column(Text, nullable=False))
    # latest expiry of anything this CA signed: it stays published at least until then
    signed_until: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    created_at: datetime = Field(sa_column=_ts())
    activated_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    retired_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))


class IssuedSvid(SQLModel, table=True):
    __tablename__ = "pki_svids"
    __table_args__ = (
        Index("ix_pki_svids_identity", "tenant", "group", "workload"),
        Index("ix_pki_svids_revoked", "revoked_at"),
    )

    serial: str = Field(primary_key=True, max_length=64)  # lowercase hex
    kind: str = Field(max_length=16)  # workload | node | server
    spiffe_id: str = Field(max_length=2048, index=True)
    tenant: str | None = Field(default=None, max_length=63)
    group: str | None = Field(default=None, max_length=63)
    workload: str | None = Field(default=None, max_length=63)
    node: str | None = Field(default=None, max_length=63)
    issuer_ca_id: str = Field(max_length=64, index=True)
    not_before: datetime = Field(sa_column=_ts())
    not_after: datetime = Field(sa_column=_ts())
    revoked_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    revocation_reason: str | None = Field(default=None, max_length=500)
    created_at: datetime = Field(sa_column=_ts())


class RevokedIdentity(SQLModel, table=True):
    """A tenant, group or workload whose identity was revoked: no new SVIDs, flows to be withdrawn."""

    __tablename__ = "pki_revoked_identities"

    id: int | None = Field(default=None, primary_key=True)
    spiffe_id_prefix: str = Field(max_length=2048, unique=True)
    tenant: str = Field(max_length=63, index=True)
    group: str | None = Field(default=None, max_length=63)
    workload: str | None = Field(default=None, max_length=63)
    reason: str = Field(max_length=500)
    revoked_at: datetime = Field(sa_column=_ts())
    revoked_by: str = Field(max_length=512)


class JoinToken(SQLModel, table=True):
    """A one-time node join token; only its SHA-256 is stored."""

    __tablename__ = "pki_join_tokens"

    token_hash: str = Field(primary_key=True, max_length=64)
    node_name: str = Field(max_length=63, index=True)
    created_at: datetime = Field(sa_column=_ts())
    expires_at: datetime = Field(sa_column=_ts())
    used_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    created_by: str = Field(max_length=512)

