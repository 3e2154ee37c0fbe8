"""Sampled per-decision records: input, result, reasons and the policy version hash, queryable."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from core.clock import Clock, system_clock
from core.errors import InvalidInput
from policy.decide import AuthzDecision, FlowDecision, GrantDecision
from policy.models import DecisionRecord
from store.db import Database

log = logging.getLogger(__name__)

Decision = FlowDecision | GrantDecision | AuthzDecision
KINDS = ("flow", "grant", "authz")


def _tenant_of(kind: str, input: Mapping[str, Any]) -> str | None:
    for path in (("src", "tenant"), ("requester", "tenant"), ("principal", "tenant"), ("resource", "tenant")):
        node: Any = input
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, str):
            return node
    return None


def _outcome(decision: Decision) -> tuple[bool, str]:
    if isinstance(decision, GrantDecision):
        return decision.outcome != "deny", decision.outcome
    return decision.allow, "allow" if decision.allow else "deny"


class DecisionLog:
    """Writes a sample of decisions (every deny by default, allows at `sample_rate`) in their own transaction."""

    def __init__(
        self,
        db: Database,
        *,
        sample_rate: float = 1.0,
        always_log_denies: bool = True,
        rng: random.Random | None = None,
        clock: Clock = system_clock,
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise InvalidInput("sample_rate must be between 0 and 1")
        self.db = db
        self.sample_rate = sample_rate
        self.always_log_denies = always_log_denies
        self.rng = rng or random.Random()  # sampling, not security
        self.clock = clock

    def sampled(self, allowed: bool) -> bool:
        if not allowed and self.always_log_denies:
            return True
        return self.rng.random() < self.sample_rate

    def record(self, kind: str, input: Mapping[str, Any], decision: Decision, policy_hash: str | None) -> bool:
        """True when the decision was written; a logging failure is logged, never raised."""
        row = self.row(kind, input, decision, policy_hash)
        if row is None:
            return False
        try:
            with self.db.session() as session:
                session.add(row)
        except Exception:
            log.exception("could not write the decision log record")
            return False
        return True

    def row(
        self, kind: str, input: Mapping[str, Any], decision: Decision, policy_hash: str | None
    ) -> DecisionRecord | None:
        """The record to write when this decision is sampled (None otherwise), for a caller that adds it
        to its own transaction (the decision commits with what it decided)."""
        if kind not in KINDS:
            raise InvalidInput(f"decision kind {kind!r} is not one of {', '.join(KINDS)}")
        allowed, outcome = _outcome(decision)
        if not self.sampled(allowed):
            return None
        return DecisionRecord(
            ts=self.clock(),
            kind=kind,
            tenant=_tenant_of(kind, input),
            allowed=allowed,
            outcome=outcome,
            input=dict(input),
            result=decision.to_dict(),
            reasons=list(decision.reasons),
            policy_hash=policy_hash,
        )


def query_decisions(
    session: Session,
    *,
    kind: str | None = None,
    tenant: str | None = None,
    allowed: bool | None = None,
    policy_hash: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> list[DecisionRecord]:
    """Newest first; every filter optional."""
    if not 1 <= limit <= 10_000:
        raise InvalidInput("limit must be between 1 and 10000")
    stmt = select(DecisionRecord)
    if kind is not None:
        stmt = stmt.where(col(DecisionRecord.kind) == kind)
    if tenant is not None:
        stmt = stmt.where(col(DecisionRecord.tenant) == tenant)
    if allowed is not None:
        stmt = stmt.where(col(DecisionRecord.allowed).is_(allowed))
    if policy_hash is not None:
        stmt = stmt.where(col(DecisionRecord.policy_hash) == policy_hash)
    if since is not None:
        stmt = stmt.where(col(DecisionRecord.ts) >= since)
    if until is not None:
        stmt = stmt.where(col(DecisionRecord.ts) < until)
    stmt = stmt.order_by(col(DecisionRecord.id).desc()).limit(limit)
    return list(session.exec(stmt).all())
