"""decide_closed: a failing decider is a denial that says why (fail closed), but a failing database is not
the decider's failure: it propagates, so no grant is stored as denied because the database was away."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from policy.grants import GrantDecision, decide_closed

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_an_engine_failure_is_a_denial_with_its_reason() -> None:
    def broken(*_args: Any) -> GrantDecision:
        raise RuntimeError("engine exploded")

    decision = decide_closed(broken, None, NOW, {})  # type: ignore[arg-type]
    assert decision.outcome == "deny" and "engine exploded" in decision.reasons[0]


def test_a_database_failure_propagates_instead_of_becoming_a_denial() -> None:
    def database_away(*_args: Any) -> GrantDecision:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))

    with pytest.raises(OperationalError):
        decide_closed(database_away, None, NOW, {})  # type: ignore[arg-type]
