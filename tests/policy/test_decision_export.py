"""Decision export: streamed JSONL/CSV between a header (filter, count) and a trailer (count, SHA-256);
content equal to what was logged, filters, truncation detected. Real SQLite and PostgreSQL."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from core.clock import FrozenClock
from core.errors import InvalidInput
from policy.decide import AuthzDecision, FlowDecision, GrantDecision
from policy.decisionlog import (
    DecisionExportError,
    DecisionLog,
    export_decisions,
    format_ts,
    query_decisions,
    verify_decision_export,
)
from store.db import Database

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TENANTS = ("acme", "globex", "initech")


def _log(db: Database, n: int = 30) -> None:
    clock = FrozenClock(T0)
    log = DecisionLog(db, sample_rate=1.0, clock=clock)
    for i in range(n):
        tenant = TENANTS[i % 3]
        if i % 5 == 4:
            log.record("grant", {"requester": {"tenant": tenant}, "n": i},
                       GrantDecision("pending", ["tenant-admin:b"], [f"why {i}\nsecond line, \"quoted\""]), "ab" * 32,
                       owner=tenant)
        elif i % 7 == 6:
            log.record("authz", {"action": "x.y", "n": i}, AuthzDecision(False, ["no tenant here"]), None, owner=None)
        else:
            log.record("flow", {"src": {"tenant": tenant, "group": "é-web"}, "port": 443, "n": i},
                       FlowDecision(i % 2 == 0, [f"reason {i}"]), "cd" * 32, owner=tenant)
        clock.advance(timedelta(seconds=10))


def _expected(db: Database, **flt: Any) -> list[dict[str, Any]]:
    with db.read_session() as s:
        rows = query_decisions(s, limit=10_000, **flt)
    return [
        {"id": r.id, "ts": format_ts(r.ts), "kind": r.kind, "tenant": r.tenant, "allowed": r.allowed,
         "outcome": r.outcome, "input": r.input, "result": r.result, "reasons": r.reasons,
         "policy_hash": r.policy_hash}
        for r in reversed(rows)
    ]


def _export(db: Database, fmt: str = "jsonl", **flt: Any) -> bytes:
    buf = io.BytesIO()
    export_decisions(db, buf, fmt=fmt, clock=FrozenClock(T0 + timedelta(days=1)), batch=4, **flt)
    return buf.getvalue()


def _records(data: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    report = verify_decision_export(io.BytesIO(data), got.append)
    return report.header, got


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_equals_what_was_logged(db: Database, fmt: str) -> None:
    _log(db)
    data = _export(db, fmt)
    header, got = _records(data)
    expected = _expected(db)
    assert len(expected) == 30 and got == expected
    assert header["count"] == 30 and header["filter"] == {"since": None, "until": None, "tenant": None}
    assert header["output"] == fmt and header["exported_at"] == "2026-11-02T12:00:00.000000Z"
    assert got[0]["ts"] == "2026-11-01T12:00:00.000000Z" and got[0]["ts"].endswith("Z")
    assert {r["kind"] for r in got} == {"flow", "grant", "authz"}
    assert any(r["tenant"] is None for r in got) and any(r["policy_hash"] is None for r in got)


def test_empty_log_exports_header_and_trailer(db: Database) -> None:
    data = _export(db)
    lines = data.splitlines()
    assert len(lines) == 2 and lines[0].startswith(b'{"header":') and lines[1].startswith(b'{"trailer":')
    assert verify_decision_export(io.BytesIO(data)).count == 0


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_filters_select_exactly_the_matching_records(db: Database, fmt: str) -> None:
    _log(db)
    since, until = T0 + timedelta(seconds=50), T0 + timedelta(seconds=200)
    for flt in ({"tenant": "acme"}, {"since": since}, {"until": until}, {"since": since, "until": until},
                {"since": since, "until": until, "tenant": "globex"}):
        header, got = _records(_export(db, fmt, **flt))
        assert got == _expected(db, **flt) and header["count"] == len(got) > 0, flt
        assert header["filter"]["tenant"] == flt.get("tenant")
    header, got = _records(_export(db, fmt, tenant="acme", since=since, until=until))
    assert {r["tenant"] for r in got} == {"acme"}
    assert all(since <= datetime.fromisoformat(r["ts"]) < until for r in got)
    assert header["filter"] == {"since": "2026-11-01T12:00:50.000000Z", "until": "2026-11-01T12:03:20.000000Z",
                                "tenant": "acme"}
    # a bound in another zone means the same instant
    plus2 = timezone(timedelta(hours=2))
    assert _records(_export(db, fmt, since=since.astimezone(plus2)))[1] == _expected(db, since=since)
    assert _records(_export(db, fmt, tenant="nobody"))[1] == []


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_trailer_detects_truncation_and_damage(db: Database, fmt: str) -> None:
    _log(db, 12)
    data = _export(db, fmt)
    assert verify_decision_export(io.BytesIO(data)).count == 12
    lines = data.splitlines(keepends=True)
    for cut in range(1, len(lines)):  # every whole-line prefix lacks the trailer
        with pytest.raises(DecisionExportError, match=r"cut short|no header"):
            verify_decision_export(io.BytesIO(b"".join(lines[:cut])))
    with pytest.raises(DecisionExportError, match="cut short"):
        verify_decision_export(io.BytesIO(data[:-5]))  # a partial last line
    dropped = b"".join(lines[:3] + lines[4:])  # one record gone, trailer kept
    with pytest.raises(DecisionExportError, match="record"):
        verify_decision_export(io.BytesIO(dropped))
    changed = data.replace(b"reason 2", b"reason 3", 1)
    with pytest.raises(DecisionExportError, match="SHA-256"):
        verify_decision_export(io.BytesIO(changed))
    with pytest.raises(DecisionExportError, match="after the trailer"):
        verify_decision_export(io.BytesIO(data + lines[-2]))


def test_bad_filters_write_nothing(db: Database) -> None:
    for kw in ({"since": datetime(2026, 1, 1)}, {"since": T0, "until": T0}, {"tenant": "Not A Slug"},
               {"fmt": "xml"}):
        buf = io.BytesIO()
        with pytest.raises(InvalidInput):
            export_decisions(db, buf, **kw)
        assert buf.getvalue() == b""
