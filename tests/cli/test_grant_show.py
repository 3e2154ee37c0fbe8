"""`grant show` of a grant that ended early: a revoked grant's expiry is not shown as still to come (it read
`expires: ... (in 1h 59m)` after `grant revoke`, as if the path were still open for two hours)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cli.remote.grants import show_grant


def _grant(state: str, expires_at: datetime) -> dict[str, Any]:
    return {"id": "g-1", "state": state, "src_tenant": "acme", "src_group": "train", "dst_tenant": "globex",
            "dst_group": "api", "proto": "tcp", "ports": [8443], "ttl_seconds": 7200, "justification": "",
            "requested_by": "alice", "requester_tenant": "acme", "created_at": "2026-12-02T08:00:00Z",
            "pending_approvers": [], "pending_until": None, "required_approvers": [], "approvals": [],
            "expires_at": expires_at.isoformat(), "reasons": ["revoked: done"] if state == "revoked" else [],
            "notes": []}


def test_a_revoked_grant_is_not_shown_as_expiring_later(capsys: pytest.CaptureFixture[str]) -> None:
    show_grant(_grant("revoked", datetime.now(UTC) + timedelta(hours=2)))
    out = capsys.readouterr().out
    assert "expires:" not in out and "(in " not in out, out
    assert "was to expire:" in out and "(revoked before)" in out, out


def test_active_and_expired_grants_say_when(capsys: pytest.CaptureFixture[str]) -> None:
    show_grant(_grant("active", datetime.now(UTC) + timedelta(hours=2)))
    assert "  expires: " in capsys.readouterr().out
    show_grant(_grant("expired", datetime.now(UTC) - timedelta(hours=2)))
    assert "  expired: " in capsys.readouterr().out
