"""Injectable UTC clock: services take a `Clock` so tests can move time instead of sleeping."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from core.errors import InvalidInput

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


def iso_z(value: datetime) -> str:
    """A time as the API writes it: ISO 8601 in UTC with `Z` (`2026-12-02T15:17:05Z`; a naive one is UTC)."""
    return as_utc(value).isoformat().replace("+00:00", "Z")


def require_aware(value: datetime, name: str) -> datetime:
    """The time in UTC; InvalidInput when it carries no timezone (a naive time is ambiguous, never guessed)."""
    if value.tzinfo is None:
        raise InvalidInput(f"{name} must carry a timezone (e.g. 2026-01-01T00:00:00Z)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC instant Python can hold
        raise InvalidInput(f"{name} is out of range in UTC") from None


def parse_when(value: str, option: str) -> datetime:
    """An ISO 8601 time given on a command line ('Z' accepted), in UTC; InvalidInput naming the option."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise InvalidInput(f"--{option} {value!r} is not an ISO 8601 time (e.g. 2026-01-01T00:00:00Z)") from None
    if parsed.tzinfo is None:
        raise InvalidInput(f"--{option} {value!r} needs a timezone (e.g. 2026-01-01T00:00:00Z)")
    return parsed.astimezone(UTC)


def format_ttl(seconds: int) -> str:
    """The largest whole unit `parse_ttl` reads back: 604800 -> `7d`, 5400 -> `90m`, 61 -> `61s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_ttl(text: str) -> timedelta:
    """`90s`, `15m`, `12h`, `7d` or plain seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)
    except ValueError:
        raise InvalidInput(f"TTL {text!r} is not a duration like 90s, 15m, 12h or 7d") from None
    if value <= 0:
        raise InvalidInput("TTL must be positive")
    return timedelta(seconds=value)
