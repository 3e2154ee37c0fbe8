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
        found = tx.read[key] = read()
    return found


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
    if keep and any(action not in SAFE_ACTIONS for _seq, action, _leaf in between):
        keep = False
    if not keep:
        state.entries.clear()
        state.cleared += 1
    state.size = size
    state.last_leaf = rows[-1][2] if rows and rows[-1][0] == size - 1 else _leaf_at(session, size - 1)


def _leaf_at(session: Session, seq: int) -> str | None:
    rows = events_since_except(session, seq, seq + 1, SAFE_ACTIONS) if seq >= 0 else []
    return rows[0][2] if rows else None


@event.listens_for(OrmSession, "after_commit")
def _keep_reads(session: OrmSession) -> None:
    if session.in_nested_transaction():  # a savepoint's release fires it too: the outer one may still roll back
        return
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
