"""The registration checks of group-committed issuance, kept per process and proven current by the audit log.

Every change to what an issuance checks (a workload registered, revoked or unregistered, a tenant or group
quarantined, an identity prefix revoked, a placement, the trust domain's TTL rules) records an audit event in
its own transaction, under the audit head lock. So a check read under that lock at tree size S stays true
until an event numbered >= S says otherwise. A batch (one transaction, the committing one) takes the head lock,
reads the events appended since the cache's marker, and empties the cache when any of them is not one of the
few actions that never touch a registration (SAFE_ACTIONS: an allowlist, so an action added later invalidates
until it is listed); then it moves the marker to the head. A batch costs one small read instead of one
registration read per member.

The marker is the size and the leaf hash of the event just before it: a transaction that moved the marker and
then rolled back leaves a marker whose leaf is not in the log (its number gets another event, whose leaf hash
differs because leaves hash their time and predecessor), so the next batch finds the mismatch and empties the
cache. What a transaction read joins the cache only once it committed, so a read made after an uncommitted
change never outlives the change's rollback. Refusals (unknown, revoked, quarantined) are never cached: they
are read afresh each time. One state per `Database` object (weakly held): a database re-created under the same
URL starts empty.

A registration missing from the cache is read by the request's own thread before it queues its write (`seed`),
with the tree size read first: what it shows is then current as of event `at` (anything committed before is
in it, anything after has a number >= `at`). Under the lock the batch takes it instead of reading, when every
event from `at` to the head is known safe: `safe_since` (the number after the unsafe event that last emptied
the cache, or the head's size then when the marker's history was not the log's) is at most `at`. So a cold
start (every workload's first renewal) or a cache emptied by a registration change costs each request a read
in parallel with the others, not a read each, one after another, while the batch holds the head lock that
every writer of every replica waits for.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from sqlalchemy import event
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import SessionTransaction
from sqlmodel import Session

from audit.service import events_since_except, lock_head
from pki.spiffe_id import SpiffeId
from store.db import Database

SAFE_ACTIONS = frozenset({
    "svid.issue", "svid.jwt.issue", "node.renew",
    "grant.request", "grant.approve", "grant.reject", "grant.revoke", "grant.expire",
})
MAX_ENTRIES = 65_536
_TX = "tf_registrations"


@dataclass(frozen=True)
class Registered:
    """What a current registration lets an issuance sign: the SPIFFE ID and the TTL rules."""

    sid: SpiffeId
    default_ttl: int
    max_ttl: int


@dataclass
class _State:
    size: int = -1  # events 0..size-1 were scanned; -1: never
    last_leaf: str | None = None  # leaf hash of event size-1
    entries: dict[Hashable, Registered] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    cleared: int = 0  # times the cache was emptied (for tests)
    validations: int = 0
    safe_since: int = -1  # every event from here up to `size` is safe (known since the last emptying); -1: none
    seeds: dict[Hashable, tuple[int, Registered]] = field(default_factory=dict)  # read outside the lock at a size
    seeded: int = 0  # seeds taken in place of a read under the lock (for tests)


@dataclass
class _Tx:
    """One transaction's view: the validation it made and the registrations it read (kept if it commits)."""

    state: _State
    validation: int
    read: dict[Hashable, Registered]


_states: weakref.WeakKeyDictionary[Database, _State] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state(db: Database) -> _State:
    with _states_lock:
        found = _states.get(db)
        if found is None:
            found = _states[db] = _State()
        return found


def lookup(db: Database, session: Session, key: Hashable, read: Callable[[], Registered]) -> Registered:
    """The registration for `key`, from the cache when no event since it was read can have changed it, else
    `read()` (in `session`, the committing write transaction; its exception propagates, nothing is cached).
    What this transaction reads is kept only once it commits: a read after an uncommitted change must not
    outlive a rollback of that change (and the next batch's scan sees whatever this one appended)."""
    state = _state(db)
    with state.lock:
        tx = session.info.get(_TX)
        if not isinstance(tx, _Tx):
            _validate(session, state)
            tx = session.info[_TX] = _Tx(state, state.validations, {})
        found = state.entries.get(key) or tx.read.get(key)
        if found is None:
            at, seeded = state.seeds.pop(key, (-1, None))
            if seeded is not None and 0 <= state.safe_since <= at <= state.size:
                found = tx.read[key] = seeded
                state.seeded += 1
    if found is None:
        found = tx.read[key] = read()
    return found


def cached(db: Database, key: Hashable) -> bool:
    """Whether `key` is in the cache now (it may be emptied before the batch looks: then it reads, as ever)."""
    state = _state(db)
    with state.lock:
        return key in state.entries


def seed(db: Database, key: Hashable, found: Registered, at: int) -> None:
    """`found`, read outside any write transaction after the tree size `at` was read, for the next batch to take
    in place of its own read once it sees only safe events from `at` on (module docstring)."""
    state = _state(db)
    with state.lock:
        state.seeds[key] = (at, found)
        while len(state.seeds) > MAX_ENTRIES:
            state.seeds.pop(next(iter(state.seeds)))


def seeded(db: Database) -> int:
    """How many registrations a batch took from a read made before it (for tests)."""
    return _state(db).seeded


def cleared(db: Database) -> int:
    """How many times the cache of `db` was emptied (for tests)."""
    return _state(db).cleared


def _validate(session: Session, state: _State) -> None:
    """Under the head lock: empty the cache unless every event since the marker is a safe one, then move the
    marker to the head."""
    state.validations += 1
    size = lock_head(session)
    start = max(state.size - 1, 0)  # from the marker's last event: its leaf hash says whose history this is
    rows = events_since_except(session, start, size, SAFE_ACTIONS) if 0 <= state.size <= size else []
    keep = 0 <= state.size <= size and (size == 0 or (rows[:1] and rows[0][0] == start and rows[-1][0] == size - 1))
    if keep and state.size > 0:
        keep = rows[0][2] == state.last_leaf
    between = rows[1:] if state.size > 0 else rows
    unsafe = [seq for seq, action, _leaf in between if action not in SAFE_ACTIONS] if keep else []
    if not keep or unsafe:
        # the history is known from the last unsafe event on (the scan lists every one); else only from here
        safe_since = unsafe[-1] + 1 if keep else size
        state.entries.clear()
        state.seeds = {key: seed for key, seed in state.seeds.items() if seed[0] >= safe_since}  # the rest predate it
        state.cleared += 1
        state.safe_since = safe_since
    state.size = size
    state.last_leaf = rows[-1][2] if rows and rows[-1][0] == size - 1 else _leaf_at(session, size - 1)


def _leaf_at(session: Session, seq: int) -> str | None:
    rows = events_since_except(session, seq, seq + 1, SAFE_ACTIONS) if seq >= 0 else []
    return rows[0][2] if rows else None


@event.listens_for(OrmSession, "after_commit")
def _keep_reads(session: OrmSession) -> None:
    tx = session.info.pop(_TX, None)
    if isinstance(tx, _Tx) and tx.read:
        with tx.state.lock:
            if tx.state.validations == tx.validation:  # no other transaction moved the marker meanwhile
                tx.state.entries.update(tx.read)
                while len(tx.state.entries) > MAX_ENTRIES:
                    tx.state.entries.pop(next(iter(tx.state.entries)))


@event.listens_for(OrmSession, "after_transaction_end")
def _forget_reads(session: OrmSession, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # rolled back (a commit took them above); the next validates again
        session.info.pop(_TX, None)
