"""Audit tables. The events table is append-only: nothing in the code base updates or deletes a row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index
from sqlmodel import Field, SQLModel


class AuditEvent(SQLModel, table=True):
    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_tenant_seq", "tenant", "seq"),
        Index("ix_audit_events_action_seq", "action", "seq"),
        Index("ix_audit_events_ts", "ts"),
    )

    seq: int = Field(primary_key=True)  # 0-based leaf index in the Merkle tree
    ts: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    actor_id: str = Field(max_length=512)
    actor_kind: str = Field(max_length=32)
    tenant: str | None = Field(default=None, max_length=63)
    action: str = Field(max_length=64)
    object_type: str = Field(max_length=64)
    object_id: str = Field(max_length=512)
    summary: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    reason: str | None = Field(default=None, max_length=2000)
    request_id: str | None = Field(default=None, max_length=128)
    prev_hash: str = Field(max_length=64)
    leaf_hash: str = Field(max_length=64)


TABLES_V1: list[type[SQLModel]] = [AuditEvent]
