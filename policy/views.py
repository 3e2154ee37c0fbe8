"""How policy versions and decision records are shown, by the API (as its response models) and the CLI
(as --json): one shape for both, so the two never drift."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from core.clock import as_utc

if TYPE_CHECKING:  # the models (SQLModel) load where rows are read through the ORM, not for showing them
    from policy.models import DecisionRecord, PolicyVersion
    from store.readonly import Record


class VersionOut(BaseModel):
    number: int
    content_hash: str
    state: str
    tests_passed: bool
    tests_total: int
    tests_failing: list[str]
    modules: list[str]
    uploaded_by: str
    note: str
    created_at: datetime
    activated_at: datetime | None
    signed_by: str | None


class VersionDetail(VersionOut):
    sources: dict[str, str]
    tests: list[dict[str, Any]]


class DecisionOut(BaseModel):
    id: int
    ts: datetime
    kind: str
    tenant: str | None
    allowed: bool
    outcome: str
    input: dict[str, Any]
    result: dict[str, Any]
    reasons: list[str]
    policy_hash: str | None


def version_out(v: PolicyVersion | Record, detail: bool = False) -> VersionOut:
    """A version as the API and the CLI show it; `v` from the ORM or from the CLI's read-only path."""
    fields: dict[str, Any] = dict(
        number=v.number or 0, content_hash=v.content_hash, state=v.state, tests_passed=v.tests_passed,
        tests_total=len(v.tests), tests_failing=[str(t["name"]) for t in v.tests if not t.get("passed")],
        modules=sorted(v.modules), uploaded_by=v.uploaded_by, note=v.note, created_at=as_utc(v.created_at),
        activated_at=as_utc(v.activated_at) if v.activated_at else None, signed_by=v.signed_by,
    )
    if detail:
        return VersionDetail(**fields, sources=dict(v.modules), tests=list(v.tests))
    return VersionOut(**fields)


def decision_out(r: DecisionRecord) -> DecisionOut:
    return DecisionOut(id=r.id or 0, ts=as_utc(r.ts), kind=r.kind, tenant=r.tenant, allowed=r.allowed,
                       outcome=r.outcome, input=r.input, result=r.result, reasons=r.reasons, policy_hash=r.policy_hash)


