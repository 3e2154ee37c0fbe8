"""Appending to the log. Callers pass their own session: the event commits with the change or not at all."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from audit.actor import ACTOR_KINDS, Actor
from audit.models import AuditEvent
from core.canonical import canonical_json
from core.clock import system_clock

GENESIS_HASH = "0" * 64


def event_document(event: AuditEvent) -> dict[str, Any]:
    """The hashed content of an event: every field except its own leaf hash."""
    return {
        "seq": event.seq,
        "ts": event.ts.isoformat().replace("+00:00", "Z"),
        "actor": {"id": event.actor_id, "kind": event.actor_kind},
        "tenant": event.tenant,
        "action": event.action,
        "object": {"type": event.object_type, "id": event.object_id},
        "summary": event.summary,
        "reason": event.reason,
        "request_id": event.request_id,
        "prev_hash": event.prev_hash,
    }


def leaf_hash(document: Mapping[str, Any]) -> str:
    """RFC 6962 leaf hash: SHA-256(0x00 || canonical JSON)."""
    return hashlib.sha256(b"\x00" + canonical_json(dict(document))).hexdigest()


def record(
    session: Session,
    *,
    actor: Actor,
    action: str,
    object_type: str,
    object_id: str,
    tenant: str | None = None,
    summary: Mapping[str, Any] | None = None,
    reason: str | None = None,
    request_id: str | None = None,
    at: datetime | None = None,
) -> AuditEvent:
    """Append one event inside the caller's transaction; it commits or rolls back with the change."""
    if actor.kind not in ACTOR_KINDS:
        raise ValueError(f"unknown actor kind {actor.kind!r}")
    head = session.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc()).limit(1)).first()
    seq = 0 if head is None else head.seq + 1
    prev = GENESIS_HASH if head is None else head.leaf_hash
    event = AuditEvent(
        seq=seq,
        ts=at or system_clock(),
        actor_id=actor.id,
        actor_kind=actor.kind,
        tenant=tenant,
        action=action,
        object_type=object_type,
        object_id=object_id,
        summary=dict(summary or {}),
        reason=reason,
        request_id=request_id,
        prev_hash=prev,
        leaf_hash="",
    )
    event.leaf_hash = leaf_hash(event_document(event))
    session.add(event)
    session.flush()
    return event
