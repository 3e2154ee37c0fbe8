"""Policy tables. Grants are policy data: the Rego policies read the active ones."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Index, Integer, UniqueConstraint
from sqlmodel import Field, SQLModel


class Grant(SQLModel, table=True):
    """A tenant's request for flows to another tenant's group; lifecycle pending -> active -> expired|revoked,
    or rejected/denied. `expires_at` is authoritative: a grant past it is expired on every read."""

    __tablename__ = "grants"
    # An Idempotency-Key belongs to its requester: the principal's id within its tenant (`requester_tenant`, ''
    # for a platform principal). An id alone names no one: API token subjects are free text, so acme's and
    # globex's `alice` are both principal `alice` (policy/migrations.py step 14).
    __table_args__ = (UniqueConstraint("requester_tenant", "requested_by", "idempotency_key",
                                       name="uq_grants_requester_idempotency_key"),)

    id: str = Field(primary_key=True, max_length=36)
    src_tenant: str = Field(max_length=63, index=True)
    src_group: str = Field(max_length=63)
    dst_tenant: str = Field(max_length=63, index=True)
    dst_group: str = Field(max_length=63)
    proto: str = Field(max_length=8)  # tcp | udp
    ports: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    justification: str = Field(default="", max_length=2000)
    ttl_seconds: int
    state: str = Field(max_length=16, index=True)
    requested_by: str = Field(max_length=512)
    idempotency_key: str | None = Field(default=None, max_length=128)
    required_approvers: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    approvals: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    reasons: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    decided_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    expires_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    pending_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    version: int = Field(default=1)  # optimistic concurrency: approvals compare-and-set on it
    # the requesting principal's tenant, '' for a platform role (never NULL: NULLs are distinct in a UNIQUE
    # constraint); no default, so a write that forgets it fails instead of scoping to the platform. Last: the
    # column step 14 added, in the same place on both databases.
    requester_tenant: str = Field(max_length=63)




class PolicyDataVersion(SQLModel, table=True):
    """One row whose `n` every change to the rows policy.data.build_data reads bumps, in the changing
    transaction (database triggers, policy/migrations.py step 9): a kept data document is exact while n is."""

    __tablename__ = "policy_data_version"

    id: int = Field(primary_key=True)
    n: int = Field(sa_column=Column(BigInteger().with_variant(Integer(), "sqlite"), nullable=False))


POLICY_STATES = ("candidate", "active", "retired")


class PolicyVersion(SQLModel, table=True):
    """A set of Rego modules (with their *_test.rego) identified by the canonical hash of its content.

    Lifecycle: candidate (uploaded, compiled, tests run) -> active -> retired (when another version is
    activated); a retired version can be activated again (rollback). Exactly one version is active."""

    __tablename__ = "policy_versions"

    number: int | None = Field(default=None, primary_key=True)
    content_hash: str = Field(max_length=64, unique=True)
    modules: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    # [{"name": "flows_test.test_x", "passed": true, "duration_ms": 0.4, "error": null}, ...]
    tests: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    tests_passed: bool = Field(default=False)
    state: str = Field(default="candidate", max_length=16, index=True)
    uploaded_by: str = Field(max_length=512)
    note: str = Field(default="", max_length=2000)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    activated_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    signature: str | None = Field(default=None, max_length=512)  # base64, over the content hash
    signed_by: str | None = Field(default=None, max_length=128)  # fingerprint of the verifying key


class DecisionRecord(SQLModel, table=True):
    """One sampled decision: what was asked, what was answered, why, and under which policy version."""

    __tablename__ = "policy_decisions"
    __table_args__ = (Index("ix_policy_decisions_kind_ts", "kind", "ts"),)

    id: int | None = Field(default=None, primary_key=True)
    ts: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False, index=True))
    kind: str = Field(max_length=16)  # flow | grant | authz
    tenant: str | None = Field(default=None, max_length=63, index=True)
    allowed: bool
    outcome: str = Field(max_length=16)  # allow | deny | approve | pending
    input: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    result: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    reasons: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    policy_hash: str | None = Field(default=None, max_length=64)

