"""Audit tables. The events table is append-only: nothing in the code base updates or deletes a row.

- `audit_events`: one row per event; `seq` is its 0-based leaf index in the Merkle tree.
- `audit_nodes`: every complete subtree hash of level >= 1, keyed by (level, index) packed into one
  integer, written in the transaction that completes it; level 0 is `audit_events.leaf_hash`.
  Any root, inclusion or consistency proof then needs O(log^2 n) rows, never a scan of the log.
- `audit_head`: a single row (id 1) holding the tree size, the last leaf hash and the right edge of
  the tree (one hash per set bit of the size). Appends lock it (`FOR UPDATE` on PostgreSQL; SQLite
  holds the writer lock from BEGIN IMMEDIATE), which keeps concurrent appends contiguous.
  It also holds the time of the last event (appends never go back in time) and `counted_from`, the
  first position whose events carry per-key counters (audit/counters.py; 0 for a log created with them).
- `audit_counters`: per key (`tenant:acme`, `action:svid.issue`, ...) how many events it has and the
  leaf hash of the last one; advanced in the append's transaction, signed into each checkpoint.
- `audit_checkpoints`: signed checkpoints (C2SP signed notes).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Index, Integer, LargeBinary, String, Text, event, insert
from sqlalchemy.engine import Connection
from sqlmodel import Field, SQLModel

# INTEGER PRIMARY KEY is the rowid on SQLite (fast appends); 64-bit on PostgreSQL.
_BIGINT = BigInteger().with_variant(Integer(), "sqlite")

HEAD_ID = 1
NODE_LEVEL_SHIFT = 56  # node key = level << 56 | index


def node_key(level: int, index: int) -> int:
    return (level << NODE_LEVEL_SHIFT) | index


class AuditEvent(SQLModel, table=True):
    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_tenant_seq", "tenant", "seq"),
        Index("ix_audit_events_action_seq", "action", "seq"),
        Index("ix_audit_events_ts", "ts"),
    )

    seq: int = Field(sa_column=Column(_BIGINT, primary_key=True, autoincrement=False))
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
    # The exact RFC 8785 bytes that were hashed (leaf = SHA-256(0x00 || data)); exports stream them
    # verbatim so neither the exporter nor the verifier has to re-canonicalize.
    data: str = Field(default="", sa_column=Column(Text, nullable=False))
    # Added by schema step 15 (audit/migrations.py), hence last: the actor's tenant (audit/actor.py), NULL for an
    # actor of no tenant and for every event written before actors named theirs (their hashed bytes lack it).
    actor_tenant: str | None = Field(default=None, sa_column=Column(String(63), nullable=True))


class AuditNode(SQLModel, table=True):
    __tablename__ = "audit_nodes"

    key: int = Field(sa_column=Column(_BIGINT, primary_key=True, autoincrement=False))
    hash: bytes = Field(sa_column=Column(LargeBinary(32), nullable=False))


class AuditHead(SQLModel, table=True):
    __tablename__ = "audit_head"

    id: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    size: int = Field(sa_column=Column(_BIGINT, nullable=False))
    last_leaf: str = Field(max_length=64)
    frontier: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # Added by schema step 6 (audit/migrations.py), hence nullable.
    last_ts: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    counted_from: int | None = Field(default=None, sa_column=Column(_BIGINT, nullable=True))


class AuditCounter(SQLModel, table=True):
    __tablename__ = "audit_counters"

    key: str = Field(sa_column=Column(String(200), primary_key=True))
    count: int = Field(sa_column=Column(_BIGINT, nullable=False))
    last_leaf: str = Field(sa_column=Column(String(64), nullable=False))


class AuditCheckpoint(SQLModel, table=True):
    __tablename__ = "audit_checkpoints"

    id: int | None = Field(default=None, primary_key=True)
    size: int = Field(sa_column=Column(_BIGINT, nullable=False, unique=True))
    root_hash: str = Field(max_length=64)
    origin: str = Field(max_length=255)
    key_name: str = Field(max_length=255)
    note: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


@event.listens_for(AuditHead.__table__, "after_create")  # type: ignore[attr-defined]
def _create_head_row(target: Any, connection: Connection, **_kw: Any) -> None:
    """The head row exists from the moment the table does, so appends only ever lock it."""
    connection.execute(insert(target).values(id=HEAD_ID, size=0, last_leaf="0" * 64, frontier=[], counted_from=0))


TABLES_V1: list[type[SQLModel]] = [AuditEvent, AuditNode, AuditHead, AuditCheckpoint]
