"""Policy tables. Grants are policy data: the Rego policies read the active ones."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, UniqueConstraint
from sqlmodel import Field, SQLModel

GRANT_STATES = ("pending", "active", "expired", "revoked", "rejected", "denied")


class Grant(SQLModel, table=True):
    """A tenant's request for flows to another tenant's group; lifecycle pending -> active -> expired|revoked,
    or rejected/denied. `expires_at` is authoritative: a grant past it is expired on every read."""

    __tablename__ = "grants"
    __table_args__ = (UniqueConstraint("requested_by", "idempotency_key"),)

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


# The policy work adds its tables (policy versions, decision log) to this list before it lands.
TABLES_V1: list[type[SQLModel]] = [Grant]
