"""Group commit: concurrent small writes share one durable transaction.

A request that has done its slow work outside the database (an SVID signed, say) hands the committer a
function that writes its rows and audit event into a session, and waits. One caller at a time leads (in its
own thread: no hand-off to a committer thread and back): it takes whatever is queued (up to `max_batch`), runs
every function in one write transaction and commits: one BEGIN, one audit head lock, one COMMIT (one fsync) for
the lot; then the next batch, until its own item is answered, when it wakes the first caller still queued to
lead in turn. Each caller's result is returned only after that COMMIT succeeded, so nobody is told "done" for a
row that is not durable.

Each item may need a SAVEPOINT of its own (unless submitted with savepoint=False, or alone in its batch: then
its failure is the batch's, which fails it alone all the same, for two round trips fewer), and its audit events are
appended after every such item ran (store/deferred.py: row locks before the head's, as in every other write
transaction, so no deadlock with one). A batch first runs its items without their savepoints (they cost two
statements and the ORM's nested transaction each, more than the rest of a grant's write); only when one of them
raises is that transaction rolled back whole and the batch run again with them, and the next CAREFUL_BATCHES
batches take them at once (a stream of refusals costs few extra passes). There an item whose check or function
raises is rolled back to its savepoint and fails alone (its exception is its caller's), and the batch goes on with
the next; nothing of a failed item commits and nothing of the others is lost. When the appends or the COMMIT fail
(or a savepoint cannot be rolled back, the connection being lost, say), the batch is rolled back whole and every
item is run again alone, each in its own transaction, so a caller hears of a failure only when its own write failed
(functions must therefore be safe to run twice: they only write, from values computed before). A deadlock or a
serialization failure (PostgreSQL's SQLSTATE 40P01, 40001) says nothing about the write itself: the batch is rolled
back whole, releasing every lock it held, and each item is run alone, again up to TRANSIENT_ATTEMPTS times, as
PostgreSQL's manual asks of an application (so such a failure reaches a caller only when it repeats). A batch waits
for nothing: the leader starts the next transaction as soon as the last one committed, so a lone request pays no
delay (nor any thread switch), and under load the batch is whatever arrived during the previous commit.

An item that takes no row lock (submitted with late=True: it only reads and inserts new rows) may also join a batch
after that batch took the audit head's lock, when it was queued meanwhile: with several replicas the head's lock is
often held by another replica's transaction (a wait of 2-3 ms, through its COMMIT), and what arrived during that wait
rides along instead of paying a transaction of its own. Only an item that waits for no row lock there may: one waiting
for a row lock after the head's would take them the other way round from every other write transaction
(store/deferred.py), and a transaction holding that row while waiting for the head (another replica's batch) closes a
cycle, a deadlock PostgreSQL breaks only after deadlock_timeout (1 s, every writer stalled behind the head meanwhile).
An item whose write takes one known row lock (late=RowLock: an active grant's INSERT, whose trigger updates the policy
data version's row) joins only a batch whose transaction holds that lock already (a member took it before the head's:
note_held) or takes it then without waiting (RowLock.take_now, SKIP LOCKED): the batch then holds both locks, and
the member waits for neither; when the lock is another transaction's, the item waits for the next batch, which takes
it before the head's as every write does. An insert that may meet a unique key another transaction inserted and has
not committed (a grant's requester and Idempotency-Key) bounds its wait when written under the head
(policy.grants._insert_rows): that transaction may be waiting for it."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from store import deferred
from store.carried import settle_pending
from store.db import Database

log = logging.getLogger("trustfabric.store.groupcommit")
T = TypeVar("T")
Write = Callable[[Session], Any]
Check = Callable[[Session], None]
_Item = tuple[Write, "Check | None", "_Waiter", bool, "bool | RowLock"]  # fn, check, waiter, savepoint, late
TRANSIENT = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure: retry the transaction
TRANSIENT_ATTEMPTS = 3
CAREFUL_BATCHES = 8  # batches run with savepoints straight away after a member failed in one without


@dataclass(frozen=True)
class RowLock:
    """A row lock a late member's write takes (submit's `late`): the member may join a batch under the audit head's
    lock only when that batch's transaction holds it already, or `take_now` takes it there without waiting."""

    name: str  # what note_held and holds call it
    take_now: Callable[[Session], bool]  # lock it without waiting (SKIP LOCKED): whether this transaction holds it now


_HELD = "tf_row_locks_held"


def note_held(session: Session, name: str) -> None:
    """Record that this session's transaction holds the row lock `name` (a RowLock's): a write that took it says so, and
    a late member needing it may join the batch without a statement more. Not inside a savepoint, whose rollback
    would release the lock and not the note."""
    if not session.in_nested_transaction():
        held: set[str] = session.info.setdefault(_HELD, set())
        held.add(name)


def holds(session: Session, name: str) -> bool:
    """Whether note_held recorded the row lock `name` in this session's transaction (the session is the batch's own:
    one per transaction)."""
    return name in session.info.get(_HELD, ())


class _MemberFailed(Exception):
    """A member of a batch run without savepoints raised: the batch is run again, each member in its savepoint."""


def transient(exc: BaseException) -> bool:
    """Whether `exc` is a failure that running the same transaction again may not meet (a deadlock victim)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in TRANSIENT


class _Waiter:
    """A caller's answer: one lock, held from creation and released once the answer is set, so the caller
    wakes once (concurrent.futures.Future's condition variable woke each of a batch's callers to wait again
    for the lock the committer held while notifying: two context switches a call, ~40 us of CPU at 64)."""

    __slots__ = ("_error", "_lock", "_result", "done")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: Any = None
        self._error: BaseException | None = None
        self.done = False  # the item's answer is set (not a call to lead)

    def set_result(self, result: Any) -> None:
        self._result = result
        self.done = result is not _LEAD
        self._lock.release()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self.done = True
        self._lock.release()

    def result(self) -> Any:
        """The answer, or _LEAD; after _LEAD the waiter waits again with the next result() (the lock is held)."""
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._result


_LEAD = object()  # a waiter's answer that says: your item is still queued, lead the next batch


class GroupCommitter:
    """submit(fn) runs fn(session) in a shared write transaction and returns its result once committed."""

    def __init__(self, db: Database, *, max_batch: int = 256,
                 head_lock: Callable[[Session], object] | None = None) -> None:
        """`head_lock(session)` takes the audit head's lock (audit.lock_head; store may not import audit): a batch
        takes it before its members that run under it, so that what queued while it waited can join (late=True).
        Without it, late members join when the earlier members are done, whoever took the lock."""
        self._db = db
        self._head_lock = head_lock
        self._max = max_batch
        self._pending: list[_Item] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when no caller leads
        self._leading = False
        self._closed = False
        self.batches = 0  # committed transactions (for tests and benches)
        self.items = 0
        self.refused = 0  # items that failed alone inside a batch that committed the others
        self._careful = 0  # batches still to run with savepoints at once (only the leader touches it)

    def submit(self, fn: Callable[[Session], T], check: Check | None = None, *, savepoint: bool = True,
               late: bool | RowLock = False) -> T:
        """fn's result after the transaction it ran in committed; fn's own exception, or the database's.
        `check` runs first, in the same savepoint (a refusal, such as a revoked identity, fails this item
        alone and costs the others nothing). `savepoint=False` for an item whose fn fails only when the
        database does (its refusals all in a `check` that only reads): it saves the SAVEPOINT's statements and
        bookkeeping, and an exception of its fn then fails the batch, whose items are run again alone. It runs under
        the audit head's lock (after every savepointed member's change), so neither it nor its check may lock a row
        (one taken after the head's is the other way round from every other write transaction). Such an
        fn's rows (and audit events) may be queued and written once for the batch (store/deferred.py `batched`),
        so it must not read back what it wrote. `late=True` for an item whose check and fn take no row lock (they
        read, and insert new rows): it may join a batch that already holds the audit head's lock (the module says
        why); `late=RowLock(...)` for one that takes that one row lock besides: it joins such a batch only when the
        batch holds that lock or takes it without waiting, else it waits for the next batch.

        The caller's own thread commits (no committer thread: handing each write to one and back cost two thread
        switches per request): the first caller to find nobody leading leads, committing whatever is queued in
        batches until its own item is done; then, if more is queued, it wakes the first queued caller to lead
        in turn, and returns. Everyone else waits for its answer (or for that call to lead). The caller's checks
        still to make (store/carried.py) are made first, in its own thread: nothing is written on one that was not."""
        settle_pending()
        self._db.give_back()  # a connection held for this thread's reads waits idle in the pool, not with the caller
        waiter = _Waiter()
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._pending.append((fn, check, waiter, savepoint, late))
            lead = not self._leading
            self._leading = True
        while True:
            if lead:
                self._lead((waiter,))
            result = waiter.result()
            if result is not _LEAD:
                return cast(T, result)
            lead = True

    def submit_many(self, items: Sequence[tuple[Callable[[Session], T], Check | None]], *, savepoint: bool = True,
                    late: bool | RowLock = False) -> list[T | Exception]:
        """submit for each (fn, check) of `items` at once, as one caller: all queued together (so they share a batch,
        up to `max_batch`, unless other callers' items came first), answered once each committed. Each item's outcome,
        in their order: fn's result, or the exception it failed with (it alone: the others are not affected, as for
        separate callers). An exception that is no `Exception` (KeyboardInterrupt) is raised once every item has its
        answer. The same rules for `savepoint` and `late` as submit's, for every item."""
        settle_pending()
        self._db.give_back()
        waiters = [_Waiter() for _ in items]
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._pending.extend((fn, check, waiter, savepoint, late)
                                 for (fn, check), waiter in zip(items, waiters, strict=True))
            lead = bool(waiters) and not self._leading
            self._leading = self._leading or bool(waiters)
        outcomes: list[T | Exception] = []
        fatal: BaseException | None = None
        for waiter in waiters:  # in queue order: a hand-off of the lead reaches the first still queued (the module)
            while True:
                if lead:
                    self._lead(waiters)
                    lead = False
                try:
                    result = waiter.result()
                except Exception as exc:
                    outcomes.append(exc)
                    break
                except BaseException as exc:
                    fatal = fatal or exc
                    outcomes.append(RuntimeError(f"interrupted: {exc!r}"))
                    break
                if result is not _LEAD:
                    outcomes.append(cast(T, result))
                    break
                lead = True
        if fatal is not None:
            raise fatal
        return outcomes

    def queued(self) -> int:
        """Items waiting for the next batch (approximate; for tests)."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Refuse new writes; wait (bounded) until what is queued committed."""
        with self._lock:
            self._closed = True
            self._idle.wait_for(lambda: not self._leading, timeout=30)

    def _lead(self, own: Sequence[_Waiter]) -> None:
        """Commit batches of what is queued until every one of `own` is answered; then hand the lead on (or drop it),
        also when an unexpected error escaped a commit: nobody may be left waiting for a leader."""
        try:
            while not all(waiter.done for waiter in own):
                with self._lock:
                    batch = self._pending[: self._max]
                    del self._pending[: self._max]
                if not batch:  # cannot happen while own is queued; never spin
                    break
                self._commit(batch)
        finally:
            with self._lock:
                following = self._pending[0][2] if self._pending else None
                if following is None:
                    self._leading = False
                    self._idle.notify_all()
            if following is not None:
                following.set_result(_LEAD)

    def _commit(self, batch: list[_Item]) -> None:
        # optimistic first: members without their savepoints (two statements and the ORM's nested transaction
        # each), the batch run again with them only when a member failed; after such a failure the next
        # CAREFUL_BATCHES batches take the savepoints at once, so a stream of refusals costs few extra passes
        optimistic = self._careful == 0  # (a lone member is run without one either way; late members may join it)
        self._careful = max(0, self._careful - 1)
        try:
            try:
                done, refused = self._run(batch, savepoints=not optimistic)
            except _MemberFailed:
                self._careful = CAREFUL_BATCHES
                done, refused = self._run(batch, savepoints=True)
        except BaseException as exc:  # the commit (or a rollback) failed: each alone, so only the culprit fails
            if len(batch) == 1 and not transient(exc):
                batch[0][2].set_exception(exc)
                return
            log.info("group commit of %d writes failed (%s); committing each alone", len(batch), exc)
            if transient(exc):  # a deadlock's victim: the backoff _alone takes after one, once for the batch, so
                # the other side, woken by the rollback, takes its locks first (an item run at once could take one
                # before it, under load, and meet it again)
                time.sleep(random.uniform(0.005, 0.05))
            for item in batch:
                self._alone(item)
            return
        self.batches += 1
        self.items += len(done)
        self.refused += len(refused)
        for fut, result in done:
            fut.set_result(result)
        for fut, error in refused:
            fut.set_exception(error)

    def _run(self, live: list[_Item], *, savepoints: bool) -> tuple[list[tuple[_Waiter, Any]],
                                                                   list[tuple[_Waiter, BaseException]]]:
        """One transaction for the batch: (answers, refusals) once it committed. Without `savepoints`, a member
        (submitted with savepoint=True) that raises makes it raise _MemberFailed, rolled back whole."""
        done: list[tuple[_Waiter, Any]] = []
        refused: list[tuple[_Waiter, BaseException]] = []
        with self._db.session() as session:
            # savepointed items first, their audit appends deferred: their row locks are all taken before
            # the head's lock (store/deferred.py says why)
            deferred.begin(session)
            if not savepoints:  # no savepoint to undo a member's queued rows: they may be queued, and written
                deferred.batch(session)  # once for the lot, still before the head's lock (below)
            for fn, check, fut, isolated, _late in live:
                if not isolated:
                    continue
                if len(live) == 1 or not savepoints:  # alone: its failure is the batch's, the same outcome
                    try:
                        if check is not None:
                            check(session)
                        done.append((fut, fn(session)))
                    except Exception as exc:
                        if len(live) == 1 or transient(exc):
                            raise
                        raise _MemberFailed from exc
                    continue
                mark = deferred.mark(session)
                try:
                    with session.begin_nested():  # this item's writes, undone alone if it fails
                        if check is not None:
                            check(session)
                        result = fn(session)
                        session.flush()  # its rows now: a constraint fails this item, not the commit
                except Exception as exc:  # the caller gets it; the others go on
                    if transient(exc):  # this transaction's locks are part of the cycle: all of it again
                        raise
                    deferred.drop(session, mark)
                    refused.append((fut, exc))
                    continue
                done.append((fut, result))
            try:  # the unsavepointed members' rows before the head's lock, as a savepointed one's
                deferred.flush(session)
                session.flush()
            except Exception as exc:
                if len(live) == 1 or not done or transient(exc) or savepoints:
                    raise
                raise _MemberFailed from exc  # a constraint of some member: the savepoints will tell whose
            # from here rows and audit events are queued and written once, at the end (store/deferred.py): the
            # savepointed members' events (appended now, under the head lock) as the rest's, one statement for all
            deferred.batch(session)
            deferred.finish(session)  # the head locked; raising fails the batch: each alone below
            first_late = len(live)
            if not savepoints:  # what was queued meanwhile and may come after the head's lock joins this batch (it is
                if self._head_lock is not None:  # the caller's batch too: a second pass runs it)
                    self._head_lock(session)  # (held already when a member's deferred work took it: no round trip)
                live.extend(self._take_late(session, self._max - len(live)))
            for index, (fn, check, fut, isolated, _late) in enumerate(live):
                if isolated and index < first_late:
                    continue  # ran before the head's lock
                if isolated:  # joined late, without its savepoint: a failure runs the batch again with them
                    try:
                        if check is not None:
                            check(session)
                        done.append((fut, fn(session)))
                    except Exception as exc:
                        if transient(exc):
                            raise
                        raise _MemberFailed from exc
                    continue
                try:
                    if check is not None:
                        check(session)
                except Exception as exc:  # a refusal: the caller gets it; only reads were made
                    if isinstance(exc, SQLAlchemyError):  # no savepoint: the transaction may be unusable now
                        raise
                    refused.append((fut, exc))
                    continue
                done.append((fut, fn(session)))  # raising fails the batch: each alone below
            deferred.flush(session)  # raising fails the batch: each alone below
        return done, refused

    def _take_late(self, session: Session, room: int) -> list[_Item]:
        """Up to `room` queued items submitted with `late`, out of the queue, in their order: those needing a row lock
        only when `session`'s transaction holds it (holds) or takes it now without waiting (once per lock and batch;
        the others stay queued, for the next batch). Only the leader removes items from the queue: what it saw
        queued stays there while it takes locks, outside the queue's lock (callers only append meanwhile)."""
        if room <= 0:
            return []
        with self._lock:
            queued = [item for item in self._pending if item[4] is not False]
        taken: list[_Item] = []
        usable: dict[str, bool] = {}  # RowLock name -> this transaction holds it
        for item in queued:
            if len(taken) == room:
                break
            lock = item[4]
            if isinstance(lock, RowLock):
                if lock.name not in usable:
                    usable[lock.name] = holds(session, lock.name) or lock.take_now(session)
                    if usable[lock.name]:
                        note_held(session, lock.name)
                if not usable[lock.name]:
                    continue  # another transaction holds it (it may be waiting for this head): the next batch
            taken.append(item)
        if taken:
            chosen = {id(item) for item in taken}
            with self._lock:
                self._pending[:] = [item for item in self._pending if id(item) not in chosen]
        return taken

    def _alone(self, item: _Item) -> None:
        fn, check, fut, _isolated, _late = item
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            try:
                with self._db.session() as session:
                    if check is not None:
                        check(session)
                    result = fn(session)
            except BaseException as exc:
                if attempt < TRANSIENT_ATTEMPTS and transient(exc):
                    log.info("write failed transiently (%s); running it again", str(exc).splitlines()[0][:200])
                    time.sleep(random.uniform(0.005, 0.05) * attempt)  # backoff: the other side commits first
                    continue
                fut.set_exception(exc)
                return
            self.batches += 1
            self.items += 1
            fut.set_result(result)
            return
