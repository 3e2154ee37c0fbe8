"""Checks a request's first statement carries: a one-row read that one layer must make before the request may act
(say, its token's row: not revoked, not expired) sent as a scalar subquery of the statement another layer sends
first anyway (a grant decision's marker, policy/data.py), a round trip fewer (issue 11: each costs the database ~50
us of CPU and this process more).

The rule that keeps this safe: a check still pending when the thread begins a write (`Database.session`, a group
commit's `submit`), or when the request ends, is made then on its own (`settle_pending`): nothing is ever written
or answered on a check that was not made. Registered per request in a context variable (`carrying`), which a worker
thread's call runs in (api/workers.py copies the caller's context).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol


class CarriedCheck(Protocol):
    """A check whose one-row read may ride in another statement (PostgreSQL's SQL: `%s` marks its parameters)."""

    @property
    def pending(self) -> bool:
        """Whether it is neither made nor failed yet."""

    def subquery(self) -> tuple[str, tuple[Any, ...]]:
        """Its read as a scalar subquery (parenthesised, `%s` for each parameter) and its parameters."""

    def settle(self, value: Any) -> None:
        """Given the subquery's value, as read by a statement that carried it: raises what the check refuses with
        (a value that does not plainly pass is made again on its own, for the exact reason)."""

    def make(self) -> None:
        """Made on its own now (its own statement) when still pending; raises what it refuses with, as often as asked
        after a failure."""


_CARRIED: ContextVar[list[CarriedCheck] | None] = ContextVar("tf_carried_checks", default=None)


@contextmanager
def carrying() -> Iterator[list[CarriedCheck]]:
    """Checks registered (`defer`) in the block may ride in a later statement; any still pending when the block ends
    without error is made then (`settle_pending`), so the block's caller answers only on made checks. On an error,
    the caller settles them itself (api/handoff.py: a refused check's error comes before the block's own)."""
    checks: list[CarriedCheck] = []
    token = _CARRIED.set(checks)
    try:
        yield checks
        settle_pending()
    finally:
        _CARRIED.reset(token)


def deferrable() -> bool:
    """Whether a check made now may be registered (`defer`) instead (inside a `carrying` block)."""
    return _CARRIED.get() is not None


def defer(check: CarriedCheck) -> None:
    checks = _CARRIED.get()
    if checks is None:
        raise RuntimeError("a check may be deferred only inside a carrying() block")
    checks.append(check)


def pending() -> list[CarriedCheck]:
    """The checks of this context still to make: what a statement about to be sent may carry."""
    checks = _CARRIED.get()
    return [c for c in checks if c.pending] if checks else []


def settle_pending() -> None:
    """Make every check of this context not made yet (each its own read): before a write, before an answer."""
    checks = _CARRIED.get()
    if checks:
        for check in checks:
            check.make()
