"""Injectable UTC clock: services take a `Clock` so tests can move time instead of sleeping."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told to; for tests and deterministic replays."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FrozenClock needs a timezone-aware datetime")
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now = self.now + delta


def as_utc(value: datetime) -> datetime:
    """Databases may hand back naive datetimes (SQLite); they are stored as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
