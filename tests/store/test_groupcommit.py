"""Group commit (store/groupcommit.py) on both databases: concurrent writes share transactions, each caller
returns only once its rows are committed (a fresh reader sees them), and a failing write fails alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, text
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.models import AuditEvent
from audit.service import lock_head
from inventory.models import Tenant
from store import deferred
from store.db import Database
from store.groupcommit import GroupCommitter

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _create(slug: str) -> Callable[[Session], str]:
    def write(session: Session) -> str:
        session.add(Tenant(slug=slug, display_name=slug, created_at=NOW))
        session.flush()  # a duplicate fails here, inside the batch
        record(session, actor=Actor.system("test"), action="tenant.create", object_type="tenant", object_id=slug,
               tenant=slug, at=NOW)
        return slug
    return write


def _visible(db: Database, slug: str) -> bool:
    with db.read_session() as s:
        return s.get(Tenant, slug) is not None


def test_concurrent_writes_share_transactions_and_return_only_once_committed(db: Database) -> None:
    committer = GroupCommitter(db)
    seen_late: list[str] = []

    def one(n: int) -> None:
        slug = committer.submit(_create(f"t{n}"))
        if not _visible(db, str(slug)):
            seen_late.append(str(slug))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    committer.close()
    assert seen_late == []
    assert committer.items == 64 and committer.batches < 64  # shared transactions
    with db.read_session() as s:
        events = s.exec(select(AuditEvent).where(col(AuditEvent.action) == "tenant.create")).all()
    assert sorted(e.object_id for e in events) == sorted(f"t{n}" for n in range(64))
    assert sorted(e.seq for e in events) == list(range(len(events)))  # one gap-free sequence


def test_a_failing_write_fails_alone_and_a_refused_one_costs_the_others_nothing(db: Database) -> None:
    committer = GroupCommitter(db)
    committer.submit(_create("taken"))
    outcomes: dict[str, object] = {}
    gate = threading.Barrier(13)

    def refuse(_session: Session) -> None:
        raise PermissionError("refused by its check")

    def one(slug: str, check: object = None) -> None:
        gate.wait()
        try:
            outcomes[slug] = committer.submit(_create(slug), check)  # type: ignore[arg-type]
        except Exception as exc:
            outcomes[slug] = exc

    threads = [threading.Thread(target=one, args=(f"ok{n}",)) for n in range(10)]
    threads.append(threading.Thread(target=one, args=("taken",)))  # a duplicate: fails at flush
    threads.append(threading.Thread(target=one, args=("refused", refuse)))
    for t in threads:
        t.start()
    gate.wait()
    for t in threads:
        t.join()
    committer.close()
    assert all(outcomes[f"ok{n}"] == f"ok{n}" and _visible(db, f"ok{n}") for n in range(10))
    assert isinstance(outcomes["taken"], Exception)
    assert isinstance(outcomes["refused"], PermissionError) and not _visible(db, "refused")
    with db.read_session() as s:
        creates = s.exec(select(AuditEvent.object_id).where(col(AuditEvent.action) == "tenant.create")).all()
    assert sorted(creates) == sorted(["taken", *(f"ok{n}" for n in range(10))])  # no event without its change


def test_a_closed_committer_refuses_new_writes(db: Database) -> None:
    committer = GroupCommitter(db)
    committer.close()
    with pytest.raises(RuntimeError, match="closed"):
        committer.submit(_create("late"))


class _OneBatch:
    """Submits `items` (name, function) so that they form one batch: a first item, `first`, keeps the committer
    busy until `release()`, and each item is submitted once the one before it is queued (bounded waits)."""

    def __init__(self, committer: GroupCommitter, first: Callable[[Session], object],
                 items: list[tuple[str, Callable[[Session], object]]], *, savepoint: bool = True) -> None:
        self.outcomes: dict[str, object] = {}
        self._committer, self._hold, held = committer, threading.Event(), threading.Event()
        self._savepoint = savepoint

        def blocker(session: Session) -> object:
            held.set()
            assert self._hold.wait(timeout=30)
            return first(session)

        self._threads = [threading.Thread(target=self._one, args=("first", blocker))]
        self._threads[0].start()
        assert held.wait(timeout=30)
        for name, fn in items:
            self._threads.append(threading.Thread(target=self._one, args=(name, fn)))
            self._threads[-1].start()
            deadline = time.monotonic() + 30
            while committer.queued() < len(self._threads) - 1 and time.monotonic() < deadline:
                time.sleep(0.001)  # waits for the queue, bounded: the order of the batch is the test's

    def _one(self, name: str, fn: Callable[[Session], object]) -> None:
        try:
            self.outcomes[name] = self._committer.submit(fn, savepoint=self._savepoint)
        except Exception as exc:
            self.outcomes[name] = exc

    def release(self) -> None:
        self._hold.set()

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=60)


def test_a_member_failing_after_its_writes_is_undone_alone_inside_the_shared_transaction(db: Database) -> None:
    """Each member runs in a savepoint: one that wrote its row and its audit event and then failed leaves
    neither behind, the others commit in the same transaction, and the sequence stays gap-free."""
    committer = GroupCommitter(db)

    def late_failure(session: Session) -> str:
        _create("doomed")(session)
        raise LookupError("failed after writing its row and its event")

    batch = _OneBatch(committer, _create("first"),
                      [("a", _create("a")), ("doomed", late_failure), ("b", _create("b"))])
    batch.release()
    batch.join()
    committer.close()
    outcomes = batch.outcomes
    assert outcomes["a"] == "a" and outcomes["b"] == "b" and outcomes["first"] == "first"
    assert isinstance(outcomes["doomed"], LookupError) and not _visible(db, "doomed")
    assert committer.batches == 2 and committer.refused == 1  # the three shared one transaction
    with db.read_session() as s:
        events = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [e.object_id for e in events if e.action == "tenant.create"] == ["first", "a", "b"]
    assert [e.seq for e in events] == list(range(len(events)))


def test_a_batch_takes_savepoints_only_once_a_member_failed(db: Database) -> None:
    """Members run without their savepoints while none fails (two statements each saved); a failure rolls that
    transaction back and the batch runs again with them (the culprit fails alone, the others commit), and the
    batches just after take them at once (a stream of refusals pays few second passes)."""
    committer = GroupCommitter(db)
    savepoints: list[str] = []
    event.listen(db.engine, "savepoint", lambda _conn, name: savepoints.append(str(name)))

    def run(first: str, names: list[str]) -> dict[str, object]:
        batch = _OneBatch(committer, _create(first), [(n, _create(n.rstrip("!"))) for n in names])
        batch.release()
        batch.join()
        return batch.outcomes

    assert run("first", ["a", "b"]) == {"first": "first", "a": "a", "b": "b"}
    assert savepoints == [] and committer.batches == 2
    outcomes = run("second", ["c", "a!", "d"])  # "a!" creates "a" again: a duplicate, found at the batch's flush
    assert (outcomes["c"], outcomes["d"]) == ("c", "d") and isinstance(outcomes["a!"], Exception)
    assert len(savepoints) == 3 and committer.batches == 4 and committer.refused == 1  # the second pass's
    assert run("third", ["e", "f"]) == {"first": "third", "e": "e", "f": "f"}
    committer.close()
    assert len(savepoints) == 5  # careful at once: no pass without them first
    assert _creates(db) == ["first", "a", "b", "second", "c", "d", "third", "e", "f"]


def _create_batched(slug: str) -> Callable[[Session], str]:
    """_create for a member without a savepoint: its row queued (store/deferred.py) and written at the flush."""
    def write(session: Session) -> str:
        def write_all(rows: list[Tenant]) -> None:
            session.add_all(rows)
            session.flush()

        row = Tenant(slug=slug, display_name=slug, created_at=NOW)
        rows: list[Tenant] | None = deferred.batched(session, "test.tenants", list, write_all)
        if rows is None:
            session.add(row)
            session.flush()
        else:
            rows.append(row)
        record(session, actor=Actor.system("test"), action="tenant.create", object_type="tenant", object_id=slug,
               tenant=slug, at=NOW)
        return slug
    return write


def _creates(db: Database) -> list[str]:
    with db.read_session() as s:
        events = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [e.seq for e in events] == list(range(len(events)))  # one gap-free sequence
    return [e.object_id for e in events if e.action == "tenant.create"]


def test_members_without_savepoints_write_their_rows_once_per_batch(db: Database) -> None:
    committer = GroupCommitter(db)
    batch = _OneBatch(committer, _create_batched("first"),
                      [(n, _create_batched(n)) for n in ("a", "b", "c")], savepoint=False)
    batch.release()
    batch.join()
    committer.close()
    assert batch.outcomes == {"first": "first", "a": "a", "b": "b", "c": "c"}
    assert committer.batches == 2 and all(_visible(db, n) for n in ("a", "b", "c"))
    assert _creates(db) == ["first", "a", "b", "c"]


def test_a_batch_whose_queued_rows_fail_to_write_runs_each_member_alone(db: Database) -> None:
    """The flush of queued rows fails (a duplicate): the batch is rolled back whole, each member is run again
    alone, and only the duplicate fails; no event without its row, the sequence gap-free."""
    committer = GroupCommitter(db)
    committer.submit(_create("taken"))
    batch = _OneBatch(committer, _create_batched("first"),
                      [(n, _create_batched(n)) for n in ("a", "taken", "b")], savepoint=False)
    batch.release()
    batch.join()
    committer.close()
    assert batch.outcomes["a"] == "a" and batch.outcomes["b"] == "b" and batch.outcomes["first"] == "first"
    assert isinstance(batch.outcomes["taken"], Exception)
    assert committer.batches == 1 + 1 + 2  # "taken", "first", then a and b alone
    assert _creates(db) == ["taken", "first", "a", "b"]


def test_a_batch_takes_its_row_locks_before_the_audit_head_and_cannot_deadlock(postgres_db: Database) -> None:
    """A transaction of its own locks its row, then appends its event (the head's lock). A batch whose first member
    appended before its second member asked for that row would hold the head while waiting for the row: a
    deadlock PostgreSQL breaks by failing one of them. The batch appends after every member's change instead, so
    the outside transaction appends and commits, and then the whole batch does (PostgreSQL: SQLite's writer lock
    lets one write transaction run at a time, so the interleaving cannot happen there)."""
    db = postgres_db
    committer = GroupCommitter(db)
    committer.submit(_create("contended"))
    row_locked, done = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def outside() -> None:  # locks the tenant row, waits until the batch waits for it, then appends
        try:
            with db.session() as s:
                s.exec(select(Tenant).where(col(Tenant.slug) == "contended").with_for_update()).one()
                row_locked.set()
                deadline = time.monotonic() + 30
                while not _someone_waits_for_a_lock(db) and time.monotonic() < deadline:
                    time.sleep(0.01)  # bounded: the batch's second member is about to wait for this row
                record(s, actor=Actor.system("test"), action="tenant.update", object_type="tenant",
                       object_id="contended", tenant="contended", at=NOW)
            outcomes["outside"] = "committed"
        except Exception as exc:
            outcomes["outside"] = exc
        finally:
            done.set()

    def touch(session: Session) -> str:
        session.exec(select(Tenant).where(col(Tenant.slug) == "contended").with_for_update()).one()
        record(session, actor=Actor.system("test"), action="tenant.update", object_type="tenant",
               object_id="contended", tenant="contended", at=NOW)
        return "touched"

    # one batch: an append, then the row
    batch = _OneBatch(committer, lambda _s: "first", [("appends", _create("appends")), ("touch", touch)])
    holder = threading.Thread(target=outside)
    holder.start()
    assert row_locked.wait(timeout=30)
    batch.release()
    assert done.wait(timeout=60)
    batch.join()
    holder.join(timeout=60)
    committer.close()
    outcomes.update(batch.outcomes)
    assert outcomes == {"first": "first", "appends": "appends", "touch": "touched", "outside": "committed"}
    assert committer.batches == 3  # the contended one, the blocker, and the batch under test, not retried alone
    with db.read_session() as s:
        seqs = list(s.exec(select(AuditEvent.seq).order_by(col(AuditEvent.seq))).all())
    assert seqs == list(range(len(seqs)))


def _someone_waits_for_a_lock(db: Database) -> bool:
    with db.read_session() as s:
        return bool(s.exec(select(text("count(*) > 0 FROM pg_locks WHERE NOT granted"))).one())


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["savepointed write", "check without savepoint"])
def test_a_deadlock_victim_is_run_again_and_its_caller_never_hears_of_it(postgres_db: Database, where: str) -> None:
    """PostgreSQL breaks a deadlock by failing one of its transactions (40P01); the manual asks the application
    to run it again. Here a write (or the check of an item without savepoint, as an issuance's registration
    check that locks the audit head) locks row 1 then row 2 while another transaction locks 2 then 1; the other
    waits longer before deadlock detection, so the batch is the victim: it is rolled back, run again once the
    other committed, and its caller gets its result, not the database's error."""
    db = postgres_db
    with db.session() as s:
        s.connection().execute(text("CREATE TABLE tf_deadlock (id int PRIMARY KEY, n int NOT NULL)"))
        s.connection().execute(text("INSERT INTO tf_deadlock VALUES (1, 0), (2, 0)"))
    first_locked, other_locked = threading.Event(), threading.Event()
    runs: list[int] = []

    def write(session: Session) -> str:
        runs.append(1)
        session.connection().execute(text("UPDATE tf_deadlock SET n = n + 1 WHERE id = 1"))
        if len(runs) == 1:  # the first run meets the other transaction half-way
            first_locked.set()
            assert other_locked.wait(10)
        session.connection().execute(text("UPDATE tf_deadlock SET n = n + 1 WHERE id = 2"))
        return "written"

    def other() -> None:
        with db.session() as s:
            s.connection().execute(text("SET LOCAL deadlock_timeout = '10s'"))  # the batch detects it first
            s.connection().execute(text("UPDATE tf_deadlock SET n = n + 10 WHERE id = 2"))
            assert first_locked.wait(10)
            other_locked.set()
            s.connection().execute(text("UPDATE tf_deadlock SET n = n + 10 WHERE id = 1"))

    committer = GroupCommitter(db)
    rival = threading.Thread(target=other)
    rival.start()
    try:
        if where == "savepointed write":
            assert committer.submit(write) == "written"
        else:
            def check(session: Session) -> None:
                write(session)

            assert committer.submit(lambda _s: "checked", check, savepoint=False) == "checked"
    finally:
        rival.join(timeout=30)
        committer.close()
    # run again after a backoff: twice in all, or three times when (on a loaded machine) its second run still took
    # row 1 before the other side, woken by the rollback, did
    assert not rival.is_alive() and 2 <= len(runs) <= 3
    with db.read_session() as s:
        rows = {int(r[0]): int(r[1]) for r in s.connection().execute(text("SELECT id, n FROM tf_deadlock"))}
    assert rows == {1: 11, 2: 11}  # both transactions committed once each: the victim's first run left nothing


def test_a_lone_write_commits_in_its_callers_thread_and_a_busy_leader_hands_the_queue_on(db: Database) -> None:
    """No committer thread: a caller finding nobody committing commits its own write (no thread switch there and
    back); callers arriving while it commits are batched, and one of them leads that batch once it is done."""
    committer = GroupCommitter(db)
    ran_in: list[int] = []

    def where(session: Session) -> object:
        ran_in.append(threading.get_ident())
        return _create("lone")(session)

    assert committer.submit(where) == "lone"
    assert ran_in == [threading.get_ident()]
    batch = _OneBatch(committer, _create("first"), [("a", _create("a")), ("b", _create("b"))])
    batch.release()
    batch.join()
    committer.close()
    assert batch.outcomes == {"first": "first", "a": "a", "b": "b"}
    assert committer.batches == 3 and committer.queued() == 0  # lone, first, then a and b together
    assert all(_visible(db, n) for n in ("lone", "first", "a", "b"))


@pytest.mark.postgres
@pytest.mark.parametrize("duplicate", [False, True])
def test_writes_without_row_locks_join_a_batch_that_waits_for_the_audit_head(postgres_db: Database,
                                                                              duplicate: bool) -> None:
    """Another transaction (another replica's, say) holds the audit head's lock through its COMMIT. The batch
    waiting for it takes, once it holds the lock, what was queued meanwhile and takes no row lock (late=True),
    savepointed or not: one transaction instead of two. A write that may lock a row waits for the next batch (taken
    after the head's lock, it would deadlock with a transaction holding that row and waiting for the head). A late
    member that fails (a duplicate) fails alone: the batch is run again with savepoints, the others commit."""
    db = postgres_db
    committer = GroupCommitter(db)  # no head_lock: "first" takes it itself, in its deferred append
    if duplicate:
        committer.submit(_create("taken"))
    holding, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def outside() -> None:
        with db.session() as s:
            _create("outside")(s)  # appends its event: holds the head's lock until its COMMIT
            holding.set()
            assert release.wait(timeout=30)

    def one(name: str, fn: Callable[[Session], object], savepoint: bool = True, late: bool = False) -> None:
        try:
            outcomes[name] = committer.submit(fn, savepoint=savepoint, late=late)
        except Exception as exc:
            outcomes[name] = exc

    holder = threading.Thread(target=outside)
    holder.start()
    assert holding.wait(timeout=30)
    late_slug = "taken" if duplicate else "late"
    members = [("first", _create("first"), {}), ("late", _create(late_slug), {"late": True}),
               ("batched", _create_batched("batched"), {"savepoint": False, "late": True}),
               ("locks", _create("locks"), {})]
    threads = []
    for n, (name, fn, how) in enumerate(members):
        threads.append(threading.Thread(target=one, args=(name, fn), kwargs=how))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while not (_someone_waits_for_a_lock(db) if n == 0 else committer.queued() == n):
            assert time.monotonic() < deadline, f"{name} never queued behind the leader waiting for the head"
            time.sleep(0.005)  # the first leads and waits for the head's lock, the rest queue behind it
    release.set()
    holder.join(timeout=60)
    for t in threads:
        t.join(timeout=60)
    committer.close()
    assert outcomes.pop("late") == "late" if not duplicate else isinstance(outcomes.pop("late"), Exception)
    assert outcomes == {"first": "first", "batched": "batched", "locks": "locks"}
    assert committer.batches == 2 + duplicate  # first, late and batched in one; then locks alone
    assert committer.refused == int(duplicate)
    expected = ["outside", "first", "late", "batched", "locks"]
    assert _creates(db) == (["taken", *[e for e in expected if e != "late"]] if duplicate else expected)


@pytest.mark.postgres
@pytest.mark.parametrize("head_lock", [True, False])
def test_a_batch_of_issuances_takes_the_head_first_so_those_queued_while_it_waits_join(postgres_db: Database,
                                                                                      head_lock: bool) -> None:
    """Members without savepoints (issuances) run under the head's lock: given `head_lock`, the batch takes it before
    them, and what queued while it waited joins (one transaction); without it, the lock is taken by the first member
    (its audit append at the flush here) and the one queued meanwhile waits for the next batch."""
    db = postgres_db
    committer = GroupCommitter(db, head_lock=lock_head if head_lock else None)
    holding, release = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def outside() -> None:
        with db.session() as s:
            _create("outside")(s)
            holding.set()
            assert release.wait(timeout=30)

    def one(name: str) -> None:
        outcomes[name] = committer.submit(_create_batched(name), savepoint=False, late=True)

    holder = threading.Thread(target=outside)
    holder.start()
    assert holding.wait(timeout=30)
    first = threading.Thread(target=one, args=("first",))
    first.start()
    deadline = time.monotonic() + 30
    while not _someone_waits_for_a_lock(db):
        assert time.monotonic() < deadline, "the leader never waited for the head's lock"
        time.sleep(0.005)  # the leader waits for the head's lock (without head_lock: at its append)
    second = threading.Thread(target=one, args=("second",))
    second.start()
    while committer.queued() < 1:
        assert time.monotonic() < deadline, "the second issuance never queued"
        time.sleep(0.005)
    release.set()
    for t in (holder, first, second):
        t.join(timeout=60)
    committer.close()
    assert outcomes == {"first": "first", "second": "second"}
    assert committer.batches == (1 if head_lock else 2)
    assert _creates(db) == ["outside", "first", "second"]


def test_submit_many_queues_its_items_together_and_answers_each(db: Database) -> None:
    """One caller's items (a batch of SVIDs) share one transaction when nothing else is queued; a failing item fails
    alone (its exception is its outcome, in its place) and the others commit; with other callers submitting at the
    same time, every item of everyone is answered once committed (the lead handed between them, none left waiting)."""
    committer = GroupCommitter(db)
    committer.submit(_create("taken"))
    batches = committer.batches
    items = [(_create(f"m{n}"), None) for n in range(5)] + [(_create("taken"), None)] + [(_create("m5"), None)]
    outcomes = committer.submit_many(items)
    assert outcomes[:5] == [f"m{n}" for n in range(5)] and outcomes[6] == "m5"
    assert isinstance(outcomes[5], Exception)  # the duplicate, alone
    assert committer.batches == batches + 1  # its six good items in one commit
    assert all(_visible(db, f"m{n}") for n in range(6))
    assert committer.submit_many([]) == []

    committer.close()
    committer = GroupCommitter(db, max_batch=7)  # small batches: a caller's items span several, led by others too
    answered: dict[str, list[str | Exception]] = {}
    gate = threading.Barrier(8)

    def many(k: int) -> None:
        gate.wait()
        answered[f"c{k}"] = committer.submit_many(
            [(_create(f"c{k}-{n}"), None) for n in range(20)])

    def one(k: int) -> None:
        gate.wait()
        answered[f"s{k}"] = [committer.submit(_create(f"s{k}"))]

    threads = [threading.Thread(target=many, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a caller was left waiting"
    committer.close()
    for k in range(4):
        assert answered[f"c{k}"] == [f"c{k}-{n}" for n in range(20)]
        assert answered[f"s{k}"] == [f"s{k}"]
    with db.read_session() as s:
        events = s.exec(select(AuditEvent).where(col(AuditEvent.action) == "tenant.create")).all()
    assert sorted(e.seq for e in events) == list(range(len(events)))  # one gap-free sequence
    assert len(events) == 1 + 6 + 4 * 20 + 4
