"""A grant request decided in one transaction and written in another (policy.grants.prepare_request, then
commit_request: how the API group-commits grant writes): the write refuses a decision that a change committed
in between may have altered, and keeps one that only other grants' lifecycle or an issuance followed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.models import AuditEvent
from audit.service import lock_head
from core.clock import as_utc
from core.quotas import QuotaExceeded, Quotas
from policy import grants
from policy.data import take_data_version_now
from policy.grants import (
    Caller,
    GrantDecision,
    GrantRequest,
    PreparedGrant,
    StaleDecision,
    commit_request,
    prepare_request,
)
from policy.models import DecisionRecord, Grant
from store import deferred
from store.db import Database

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
CALLER = Caller("acme-admin", "tenant-admin", "acme", Actor("acme-admin", "tenant", "acme"))
REQUEST = GrantRequest("acme", "web", "globex", "api", "tcp", [443], 3600)


def _approve(_session: Session, _now: datetime, _input: dict[str, Any]) -> GrantDecision:
    return GrantDecision("approve", [], ["auto-approved"])


def _pending(_session: Session, _now: datetime, _input: dict[str, Any]) -> GrantDecision:
    return GrantDecision("pending", ["tenant-admin:globex"], ["approval-needed: tenant-admin:globex"])


def _prepare(db: Database, key: str, caller: Caller = CALLER, request: GrantRequest = REQUEST,
             decide: Callable[[Session, datetime, dict[str, Any]], GrantDecision] = _approve) -> PreparedGrant:
    with db.read_session(snapshot=True) as s:
        prepared = prepare_request(s, request, caller=caller, decide=decide, idempotency_key=key,
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


@pytest.mark.parametrize("version_row", [True, False], ids=["migrated", "without-data-version-row"])
def test_a_retry_under_its_key_is_answered_with_the_first_grant(db: Database, version_row: bool) -> None:
    """prepare_request reads the grant already requested under the caller's key in its marker's statement (or,
    without the data version row, on its own): a retry gets the first grant, the same key with another request
    is a conflict, and another caller's same key is a request of its own."""
    from sqlalchemy import text

    from policy.grants import GrantConflict

    if not version_row:
        with db.session() as s:
            s.execute(text("DELETE FROM policy_data_version"))
    first = _prepare(db, "retry")
    with db.session() as s:
        commit_request(s, first, caller=CALLER)
    other = Caller("acme-other", "tenant-admin", "acme", Actor("acme-other", "tenant", "acme"))
    with db.read_session(statements=True) as s:  # as the route reads it
        again = prepare_request(s, REQUEST, caller=CALLER, decide=_approve, idempotency_key="retry", clock=lambda: NOW)
        with pytest.raises(GrantConflict, match="Idempotency-Key was already used"):
            prepare_request(s, GrantRequest("acme", "web", "globex", "api", "tcp", [8443], 3600), caller=CALLER,
                            decide=_approve, idempotency_key="retry", clock=lambda: NOW)
        elsewhere = prepare_request(s, REQUEST, caller=other, decide=_approve, idempotency_key="retry",
                                    clock=lambda: NOW)
    assert isinstance(again, Grant) and again.id == first.grant.id and again.state == "active"
    assert isinstance(elsewhere, PreparedGrant) and elsewhere.grant.id != first.grant.id


# acme's caller's id, as another tenant's principal and a platform one may carry it too (token subjects are free text)
GLOBEX_NAMESAKE = Caller(CALLER.id, "tenant-admin", "globex", Actor(CALLER.id, "tenant", "globex"))
PLATFORM_NAMESAKE = Caller(CALLER.id, "admin", None, Actor(CALLER.id, "admin"))
GLOBEX_REQUEST = GrantRequest("globex", "api", "acme", "web", "tcp", [443], 3600)


def test_a_key_is_the_requesters_within_its_tenant_not_every_principal_of_its_id(db: Database) -> None:
    """A principal's id is unique only within its tenant: globex's and the platform's principal of acme's caller's id
    each request under the same Idempotency-Key (never a conflict, never acme's grant), their grants are stored side
    by side, and find_by_idempotency_key (the route's answer when a concurrent retry won the insert) answers each
    with its own."""
    from policy.grants import find_by_idempotency_key

    ours = _prepare(db, "same")
    with db.session() as s:
        commit_request(s, ours, caller=CALLER)
    with db.read_session(statements=True) as s:
        theirs = prepare_request(s, GLOBEX_REQUEST, caller=GLOBEX_NAMESAKE, decide=_approve, idempotency_key="same",
                                 clock=lambda: NOW)  # not "already used for a different grant request"
        platform = prepare_request(s, REQUEST, caller=PLATFORM_NAMESAKE, decide=_approve, idempotency_key="same",
                                   clock=lambda: NOW)  # the very request acme's caller made: not its grant
    assert isinstance(theirs, PreparedGrant) and isinstance(platform, PreparedGrant)
    assert (theirs.grant.requester_tenant, platform.grant.requester_tenant, ours.grant.requester_tenant) == (
        "globex", "", "acme")
    with db.session() as s:  # the same (id, key) three times: one per requester's tenant
        commit_request(s, theirs, caller=GLOBEX_NAMESAKE)
        commit_request(s, platform, caller=PLATFORM_NAMESAKE)
    with db.read_session() as s:
        found = {c.requester_tenant: find_by_idempotency_key(s, c, "same")
                 for c in (CALLER, GLOBEX_NAMESAKE, PLATFORM_NAMESAKE)}
        assert {t: g.id if g else None for t, g in found.items()} == {
            "acme": ours.grant.id, "globex": theirs.grant.id, "": platform.grant.id}
        assert find_by_idempotency_key(s, CALLER, "other") is None


def test_a_prepared_grant_is_the_grant_its_write_stores(db: Database) -> None:
    """prepare_request builds its Grant without SQLModel's __init__ (policy.grants.new_grant): the same object as
    the model's constructor makes (fields, fields set, a transient ORM instance), and what its write stores and a
    read returns; the ORM's own unit of work can insert one too."""
    from sqlalchemy import inspect

    from policy.grants import new_grant

    prepared = _prepare(db, "built")
    built = prepared.grant
    constructed = Grant(**built.model_dump())
    assert built.model_dump() == constructed.model_dump() and built.model_fields_set == constructed.model_fields_set
    assert inspect(built).transient and built.version == 1
    with db.session() as s:
        commit_request(s, prepared, caller=CALLER)
        s.add(new_grant(**{**built.model_dump(), "id": "g-by-the-orm", "idempotency_key": None}))
    with db.read_session() as s:
        stored = s.get(Grant, built.id)
        by_orm = s.get(Grant, "g-by-the-orm")
        assert stored is not None and by_orm is not None
        assert stored.model_dump() == built.model_dump()
        assert by_orm.model_dump() == {**built.model_dump(), "id": "g-by-the-orm", "idempotency_key": None}
    with pytest.raises(TypeError, match="version"):
        new_grant(**{k: v for k, v in built.model_dump().items() if k != "version"})


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


def _logged(db: Database) -> list[tuple[Any, ...]]:
    with db.read_session() as s:
        return [(r.kind, r.tenant, r.outcome, r.input, r.result, r.reasons, r.policy_hash, as_utc(r.ts))
                for r in s.exec(select(DecisionRecord).order_by(col(DecisionRecord.id))).all()]


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batched"])
def test_a_grants_decision_record_is_written_in_its_transaction_and_undone_with_it(db: Database, batched: bool) -> None:
    """The decision log's row goes with its grant (on PostgreSQL in the grant's INSERT; in a group commit's batch
    with the batch's grant rows): a transaction rolled back after the writes leaves neither, a committed one both,
    the record holding what was asked and answered."""
    from policy.decide import GrantDecision as LoggedDecision
    from policy.decisionlog import DecisionLog

    log = DecisionLog(db, clock=lambda: NOW)
    asked = REQUEST.policy_input("acme")

    def write(fail: bool) -> None:
        prepared = [_prepare(db, "logged-1"), _prepare(db, "logged-2")]
        with db.session() as s:
            if batched:
                deferred.batch(s)  # as a group commit's members without savepoints: rows queued, written together
            for p in prepared:
                row = log.row("grant", asked, LoggedDecision("approve", [], ["auto-approved"]), "sha256:v1",
                              owner="acme")
                commit_request(s, p, caller=CALLER, decision_record=row)
            deferred.flush(s)
            if fail:
                raise RuntimeError("the transaction failed after its writes")

    with pytest.raises(RuntimeError):
        write(fail=True)
    assert _stored(db) == ([], []) and _logged(db) == []
    write(fail=False)
    assert _stored(db)[0] == ["logged-1", "logged-2"]
    record = ("grant", "acme", "approve", asked, {"outcome": "approve", "approvers": [], "reasons": ["auto-approved"]},
              ["auto-approved"], "sha256:v1", NOW)
    assert _logged(db) == [record, record]


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


def _group_committed(db: Database, quotas: Quotas | None, keys: list[str]) -> dict[str, object]:
    """Grant writes through a group committer, all but the first in one batch (tests/store/test_groupcommit.py's
    _OneBatch): each key's grant, or the exception its caller got."""
    from store.groupcommit import GroupCommitter
    from tests.roundtrips import watch
    from tests.store.test_groupcommit import _OneBatch

    committer = GroupCommitter(db)

    def write(prepared: PreparedGrant) -> Callable[[Session], object]:
        return lambda s: commit_request(s, prepared, caller=CALLER, quotas=quotas).idempotency_key

    first, *rest = [(key, write(_prepare(db, key))) for key in keys]
    with watch(db.engine) as sent:
        batch = _OneBatch(committer, first[1], rest)
        sent.next_round()  # the batch's statements: a new connection's, traced from its checkout
        batch.release()
        batch.join()
    committer.close()
    return {**batch.outcomes, "inserts": sum("INSERT INTO grants" in q for q in sent.rounds[-1])}


def test_a_batchs_grants_are_written_together_and_a_quota_still_counts_each_one(db: Database) -> None:
    """Without a quota to count them, a batch's grant rows are queued and written together before the head's lock
    (store/deferred.py); with one, each is written at once, so the next member's count sees it: of three asking
    for the last two places in one batch, the third is refused and nothing of it is written."""
    outcomes = _group_committed(db, None, ["a", "b", "c", "d"])
    # the first's INSERT, then the batch's three in one round trip
    assert outcomes == {"first": "a", "b": "b", "c": "c", "d": "d", "inserts": 2}
    assert _stored(db)[0] == ["a", "b", "c", "d"] and len(_stored(db)[1]) == 4
    outcomes = _group_committed(db, Quotas(grants=7), ["e", "f", "g", "h"])
    assert (outcomes["first"], outcomes["f"], outcomes["g"]) == ("e", "f", "g")
    inserts = outcomes["inserts"]
    assert isinstance(outcomes["h"], QuotaExceeded) and isinstance(inserts, int) and inserts >= 3  # each at once
    grants, events = _stored(db)
    assert grants == ["a", "b", "c", "d", "e", "f", "g"] and len(events) == 7  # no event without its grant


@pytest.mark.postgres
def test_a_grant_written_under_the_audit_head_never_waits_for_an_uncommitted_idempotency_key(
        postgres_db: Database) -> None:
    """A group commit may write a grant after taking the audit head's lock (a late member). Another transaction that
    inserted the same Idempotency-Key (the same request sent to another replica at once) and has not committed is
    waiting for that head, or will: waiting for it would be a deadlock, broken by PostgreSQL only after
    deadlock_timeout with every writer stalled behind the head. The INSERT gives up after a few milliseconds instead,
    failing its transaction (the group committer then runs each member alone), and leaves the other untouched."""
    db = postgres_db
    inserted, release = threading.Event(), threading.Event()

    def other() -> None:  # the same key inserted (its append, and so the head, still to come), held uncommitted
        with db.session() as s:
            grants._insert_rows(s, [(_prepare(db, "same-key").grant, None)])
            inserted.set()
            release.wait(timeout=30)
            s.rollback()

    rival = threading.Thread(target=other)
    rival.start()
    try:
        assert inserted.wait(timeout=30)
        prepared = _prepare(db, "same-key")
        with db.session() as s:
            lock_head(s)  # as a batch that took the head, the rival now waiting for it at its append
            with pytest.raises(OperationalError, match="lock timeout"):
                grants._insert_rows(s, [(prepared.grant, None)])
            s.rollback()
    finally:
        release.set()
        rival.join(timeout=60)
    with db.session() as s:  # no head held: the same INSERT now simply writes (the rival rolled back)
        grants._insert_rows(s, [(prepared.grant, None)])
    assert _stored(db)[0] == ["same-key"]


@pytest.mark.postgres
def test_a_namesake_of_another_tenant_never_waits_for_an_uncommitted_grant_under_the_same_key(
        postgres_db: Database) -> None:
    """Another tenant's principal of the same id inserting the same Idempotency-Key is not the same key: its INSERT
    under the audit head's lock writes at once beside the uncommitted one (with the key unique per id alone, it
    waited for it and failed its batch), and both commit. (Pending grants: an active one's INSERT also updates the
    policy data version's row, step 9's trigger, which the uncommitted active grant's holds.)"""
    db = postgres_db
    inserted, release = threading.Event(), threading.Event()

    def other() -> None:  # acme's caller's grant under the key, held uncommitted
        with db.session() as s:
            grants._insert_rows(s, [(_prepare(db, "same-key", decide=_pending).grant, None)])
            inserted.set()
            release.wait(timeout=30)

    rival = threading.Thread(target=other)
    rival.start()
    try:
        assert inserted.wait(timeout=30)
        prepared = _prepare(db, "same-key", GLOBEX_NAMESAKE, GLOBEX_REQUEST, _pending)
        with db.session() as s:
            lock_head(s)
            grants._insert_rows(s, [(prepared.grant, None)])
    finally:
        release.set()
        rival.join(timeout=60)
    assert _stored(db)[0] == ["same-key", "same-key"]


def _lock_waiters(db: Database) -> int:
    """Backends of this test's database waiting for a lock (a row's, the audit head's)."""
    with db.engine.connect() as conn:
        return int(conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).scalar_one())


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.mark.postgres
@pytest.mark.parametrize(("leader", "rival", "key"), [
    ("pending", True, None), ("pending", True, "late-key"), ("pending", False, None), ("active", False, None)])
def test_an_active_grant_joins_a_batch_under_the_audit_head_only_holding_the_data_version_row(
        postgres_db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, leader: str,
        rival: bool, key: str | None) -> None:
    """An active grant's INSERT also updates the policy data version's row (schema step 9's trigger): a row lock. A
    group commit's batch that took the audit head's lock before it (its own members pending grants or issuances, say)
    and let that grant join late would take the two the other way round from every other write transaction, which
    takes its row locks first. Step by step: a batch (a pending grant) waits for the head, held by another replica's
    transaction through its COMMIT; an active grant queues behind it; a rival transaction (another replica's batch of
    active grants) inserts one, so holds the row, and waits for the head behind the batch. The head is released: the
    batch must not make the late active grant wait for the row the rival holds (a deadlock PostgreSQL breaks after
    deadlock_timeout, 1 s, failing the rival or the batch; or, for a grant with an Idempotency-Key, a failed batch after
    20 ms and every member run again alone). It leaves it for its next batch instead: nobody waits for a lock held by a
    transaction waiting for it, nothing fails, nothing runs twice. Without a rival holding the row, and when the batch
    holds it already (its own member an active grant), the late grant still joins: one transaction, as before, with
    no statement more when the batch's own grant locked the row."""
    from store.groupcommit import GroupCommitter, RowLock

    db = postgres_db
    tries: list[bool] = []

    def take_now(session: Session) -> bool:
        tries.append(take_data_version_now(session))
        return tries[-1]

    monkeypatch.setattr(grants, "DATA_VERSION_ROW", RowLock(grants.DATA_VERSION_ROW.name, take_now))
    caplog.set_level(logging.INFO, logger="trustfabric.store.groupcommit")
    committer = GroupCommitter(db, head_lock=lock_head)  # as the API composes it (workflows/context.py)
    first = _prepare_unkeyed(db, _pending if leader == "pending" else _approve)
    late = _prepare_unkeyed(db, _approve, key)
    theirs = _prepare_unkeyed(db, _approve)
    holding, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def head_holder() -> None:  # another replica's transaction, holding the head through its COMMIT
        with db.session() as s:
            lock_head(s)
            holding.set()
            assert release.wait(timeout=30)

    def submit(name: str, prepared: PreparedGrant) -> None:
        try:
            outcomes[name] = committer.submit(lambda s: commit_request(s, prepared, caller=CALLER).id,
                                              late=grants.late_join(prepared, None))
        except Exception as exc:
            outcomes[name] = exc

    def rival_batch() -> None:  # another replica's active grant: the data version row, then (waiting) the head
        try:
            with db.session() as s:
                outcomes["rival"] = commit_request(s, theirs, caller=CALLER, recheck=False).id
        except Exception as exc:
            outcomes["rival"] = exc

    threads = [threading.Thread(target=head_holder)]
    threads[0].start()
    assert holding.wait(timeout=30)
    threads.append(threading.Thread(target=submit, args=("first", first)))
    threads[-1].start()
    _until(lambda: _lock_waiters(db) == 1, "the batch never waited for the audit head")
    threads.append(threading.Thread(target=submit, args=("late", late)))
    threads[-1].start()
    _until(lambda: committer.queued() == 1, "the active grant never queued behind the batch")
    if rival:
        threads.append(threading.Thread(target=rival_batch))
        threads[-1].start()
        _until(lambda: _lock_waiters(db) == 2, "the rival never waited for the audit head")
    release.set()
    for t in threads:
        t.join(timeout=60)
    committer.close()
    expected = {"first": first.grant.id, "late": late.grant.id} | ({"rival": theirs.grant.id} if rival else {})
    assert outcomes == expected
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]  # no batch failed or ran again
    assert committer.batches == 1 + rival  # with a rival, the late grant waited for the batch after
    assert tries == ([] if leader == "active" else [not rival])  # SKIP LOCKED: the rival's lock, or none
    grants_stored, requested = _stored_by_id(db)
    assert grants_stored == sorted(expected.values()) and sorted(requested) == sorted(expected.values())


def _prepare_unkeyed(db: Database, decide: Callable[[Session, datetime, dict[str, Any]], GrantDecision],
                     key: str | None = None) -> PreparedGrant:
    with db.read_session(snapshot=True) as s:
        prepared = prepare_request(s, REQUEST, caller=CALLER, decide=decide, idempotency_key=key, clock=lambda: NOW)
    assert isinstance(prepared, PreparedGrant)
    return prepared


def _stored_by_id(db: Database) -> tuple[list[str], list[str]]:
    with db.read_session() as s:
        ids = sorted(str(g) for g in s.exec(select(Grant.id)).all())
        requested = list(s.exec(select(AuditEvent.object_id).where(col(AuditEvent.action) == "grant.request")).all())
    return ids, requested
