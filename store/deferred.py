"""Work a write transaction runs last, after every change in it: how a group commit (store/groupcommit.py)
appends its members' audit events only once every member made its change.

Why: a write transaction of its own takes its rows' locks first and the audit log head's lock last (its event
comes after its change). A batch that appended member 1's event (locking the head) before member 2 locked a
row would take them the other way round, and deadlock with a transaction holding that row and waiting for the
head. With `begin`, `later(session, fn)` queues fn instead of running it; `finish` runs the queue in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from sqlmodel import Session

_KEY = "tf_deferred"


def begin(session: Session) -> None:
    """From now on, until `finish`, `later` queues in this session."""
    session.info[_KEY] = []


def later(session: Session, fn: Callable[[], object]) -> bool:
    """Queue fn when the session defers (True); otherwise do nothing (False: the caller runs it now)."""
    queue = session.info.get(_KEY)
    if not isinstance(queue, list):
        return False
    queue.append(fn)
    return True


def mark(session: Session) -> int:
    """The queue's length: where to drop back to when the work queued after it is rolled back."""
    queue = session.info.get(_KEY)
    return len(queue) if isinstance(queue, list) else 0


def drop(session: Session, at: int) -> None:
    """Forget what was queued after `at` (its savepoint was rolled back)."""
    queue = session.info.get(_KEY)
    if isinstance(queue, list):
        del queue[at:]


def finish(session: Session) -> None:
    """Run the queue in order; from now on nothing is deferred."""
    for fn in session.info.pop(_KEY, None) or ():
        fn()


# --- rows written once per batch --------------------------------------------------------------------------
# A group commit's members that cannot fail alone (store/groupcommit.py: savepoint=False; and the others while a
# batch runs without their savepoints) write rows that nothing in the transaction reads back; queued per writer and
# written at `flush` (one executemany, one round trip), they cost a statement per batch instead of per member. A
# failing flush fails the batch, whose members are then run again alone, unbatched (or, before the head's lock,
# again with their savepoints).

_BATCH = "tf_batch"
S = TypeVar("S")


def batch(session: Session) -> None:
    """From now on, until `flush`, writers that support it queue their rows (`batched`)."""
    session.info[_BATCH] = {}


def batched(session: Session, key: str, make: Callable[[], S], write: Callable[[S], None]) -> S | None:
    """When the session batches: the writer `key`'s queue (made, and `write` registered for `flush`, on first
    use); otherwise None (the caller writes now)."""
    queues = session.info.get(_BATCH)
    if not isinstance(queues, dict):
        return None
    found = queues.get(key)
    if found is None:
        found = queues[key] = (make(), write)
    return cast(S, found[0])


def flush(session: Session) -> None:
    """Write every queue, in the order of their first use; from now on nothing is batched."""
    queues = session.info.pop(_BATCH, None)
    for queue, write in (queues or {}).values():
        write(queue)
