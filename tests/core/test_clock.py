"""Time in one place: the injectable clock, the timezone check, command-line times and TTLs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from core.clock import FrozenClock, as_utc, parse_ttl, parse_when, require_aware
from core.errors import InvalidInput


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800),
                                               ("3600", 3600), (" 2H ", 7200)])
def test_ttls(text: str, seconds: int) -> None:
    assert parse_ttl(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(("text", "reason"), [("0", "positive"), ("-5m", "positive"), ("soon", "not a duration"),
                                              ("", "not a duration"), ("5w", "not a duration")])
def test_bad_ttls_say_why(text: str, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        parse_ttl(text)


def test_command_line_times_are_utc_and_need_a_zone() -> None:
    assert parse_when("2026-01-01T00:00:00Z", "since") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_when("2026-01-01T02:00:00+02:00", "until") == datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match=r"--since '2026-01-01T00:00:00' needs a timezone"):
        parse_when("2026-01-01T00:00:00", "since")
    with pytest.raises(InvalidInput, match=r"--until 'yesterday' is not an ISO 8601 time"):
        parse_when("yesterday", "until")


def test_the_timezone_check() -> None:
    east = datetime(2026, 5, 1, 12, tzinfo=timezone(timedelta(hours=3)))
    assert require_aware(east, "since") == datetime(2026, 5, 1, 9, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="since must carry a timezone"):
        require_aware(datetime(2026, 5, 1), "since")
    assert as_utc(datetime(2026, 5, 1)) == datetime(2026, 5, 1, tzinfo=UTC)  # databases hand back naive UTC
    # a time before the first UTC instant Python holds (schemathesis sent one to GET /v1/policy/decisions: a 500)
    with pytest.raises(InvalidInput, match="until is out of range in UTC"):
        require_aware(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), "until")


def test_frozen_clock_moves_only_when_told() -> None:
    clock = FrozenClock(datetime(2026, 1, 1, tzinfo=UTC))
    assert clock() == clock()
    clock.advance(timedelta(days=1))
    assert clock() == datetime(2026, 1, 2, tzinfo=UTC)
    with pytest.raises(ValueError, match="timezone-aware"):
        FrozenClock(datetime(2026, 1, 1))
