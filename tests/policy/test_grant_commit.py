"""A grant request decided in one transaction and written in another (policy.grants.prepare_request, then
commit_request: how the API group-commits grant writes): the write refuses a decision that a change committed
in between may have altered, and keeps one that only other grants' lifecycle or an issuance followed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.models import AuditEvent
from policy.grants import (
    Caller,
    GrantDecision,
    GrantRequest,
    PreparedGrant,
    StaleDecision,
    commit_request,
    prepare_request,
)
from policy.models import Grant
from store import deferred
from store.db import Database

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
CALLER = Caller("acme-admin", "tenant-admin", "acme", Actor("acme-admin", "tenant"))
REQUEST = GrantRequest("acme", "web", "globex", "api", "tcp", [443], 3600)


def _approve(_session: Session, _now: datetime, _input: dict[str, Any]) -> GrantDecision:
    return GrantDecision("approve", [], ["auto-approved"])


def _prepare(db: Database, key: str) -> PreparedGrant:
    with db.read_session(snapshot=True) as s:
        prepared = prepare_request(s, REQUEST, caller=CALLER, decide=_approve, idempotency_key=key,
                                   clock=lambda: NOW)
    assert isinstance(prepared, PreparedGrant)
    return prepared


def _event(db: Database, action: str) -> None:
    with db.session() as s:
        record(s, actor=Actor("admin", "admin"), action=action, object_type="tenant", object_id="globex",
               tenant="globex", at=NOW)


def _stored(db: Database) -> tuple[list[str], list[str]]:
    with db.read_session() as s:
        grants = sorted(str(g) for g in s.exec(select(Grant.idempotency_key)).all())
        requested = list(s.exec(select(AuditEvent.object_id).where(col(AuditEvent.action) == "grant.request")
                                .order_by(col(AuditEvent.seq))).all())
    return grants, requested


def test_a_prepared_decision_survives_grant_and_issuance_events_but_not_other_changes(db: Database) -> None:
    first, second = _prepare(db, "first"), _prepare(db, "second")
    with db.session() as s:
        commit_request(s, first, caller=CALLER)
    _event(db, "svid.issue")
    with db.session() as s:  # only another grant and an issuance since its decision: it holds
        commit_request(s, second, caller=CALLER)

    third = _prepare(db, "third")
    _event(db, "tenant.quarantine")  # may change the decision (the shipped policy denies quarantined groups)
    with pytest.raises(StaleDecision, match=r"tenant\.quarantine committed meanwhile"), db.session() as s:
        commit_request(s, third, caller=CALLER)
    assert _stored(db) == (["first", "second"], [first.grant.id, second.grant.id])  # nothing of the third

    again = _prepare(db, "third")  # decided afresh, after the change
    with db.session() as s:
        commit_request(s, again, caller=CALLER)
    assert _stored(db)[0] == ["first", "second", "third"]


def test_a_grant_write_runs_again_whole_after_its_transaction_rolled_back(db: Database) -> None:
    """The group committer runs every item of a failed batch again, alone, with the same prepared grant (a
    deadlock victim is run again too): the first transaction's rollback must leave the prepared grant usable,
    and the second run writes it once."""
    prepared = _prepare(db, "again")
    with pytest.raises(RuntimeError), db.session() as s:
        commit_request(s, prepared, caller=CALLER)
        raise RuntimeError("the batch failed after this item ran")
    assert _stored(db) == ([], [])
    with db.session() as s:
        grant = commit_request(s, prepared, caller=CALLER)
    assert grant.state == "active" and grant.src_tenant == "acme"
    assert _stored(db) == (["again"], [grant.id])


def _batch(db: Database, items: list[PreparedGrant | str]) -> str | None:
    """As a group commit runs its members (store/groupcommit.py): every member's change first, then their checks
    and events in order under the head lock (a str: another writer's event in the same batch). None when the
    batch committed, else StaleDecision's message (nothing of the batch written)."""
    try:
        with db.session() as s:
            deferred.begin(s)
            for item in items:
                if isinstance(item, str):
                    record(s, actor=Actor("admin", "admin"), action=item, object_type="tenant", object_id="globex",
                           tenant="globex", at=NOW)
                else:
                    commit_request(s, item, caller=CALLER)
            deferred.finish(s)
    except StaleDecision as e:
        return str(e)
    return None


STALE = "the decision is stale: tenant.quarantine committed meanwhile; decide again"


def test_a_batchs_later_grant_checks_are_answered_from_the_first_ones_scan_and_its_own_appends(db: Database) -> None:
    """The first member's check reads the events since its marker with the head lock; a later member whose
    marker is no earlier is answered from that and from the batch's own events, without a statement, and one
    whose marker is earlier is read. Either way an event that may change a decision makes it stale."""
    from tests.roundtrips import watch

    early = _prepare(db, "early")
    _event(db, "tenant.quarantine")
    late, later = _prepare(db, "late"), _prepare(db, "later")
    _batch(db, [_prepare(db, "warm")])  # the pool's connection traced from its next checkout on
    with watch(db.engine) as sent:
        sent.next_round()
        assert _batch(db, [late, later]) is None
    reads = [q for q in sent.rounds[-1] if q.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1, reads  # the head, the counters and the first member's scan; the second's from memory

    assert _batch(db, [_prepare(db, "late2"), "tenant.quarantine", _prepare(db, "later2")]) == STALE  # its own
    assert _batch(db, [_prepare(db, "last"), early]) == STALE  # read: its marker is before the first's
    assert _stored(db)[0] == ["late", "later", "warm"]
