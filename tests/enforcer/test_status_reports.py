"""A device's status reports (enforcer/service.py record_status) numbered by its agent (`report_seq`), on SQLite and
PostgreSQL: a report numbered at or below the stored one (a request the server processed after a newer one: a timed-out
report handled after its retry, an old agent process's last one) changes nothing and records no event, also when the
two reach the database at the same time; a report without a number (an agent from before numbering) is stored as
before."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from audit import Actor
from core.errors import InvalidInput
from enforcer import service
from tests.enforcer.stored import Stack

NODE = Actor("spiffe://example.org/node/gpu1", "node")
DEVICE = "nic:gpu1"


def _report(stack: Stack, **report: Any) -> service.StatusRecorded:
    with stack.ctx.db.session() as s:
        return service.record_status(s, DEVICE, report, actor=NODE, now=stack.clock())


def _row(stack: Stack) -> dict[str, Any]:
    with stack.ctx.db.read_session() as s:
        return service.status_row(s, DEVICE)


def _applied(stack: Stack) -> dict[str, Any]:
    """What gpu1's agent reports when it runs the desired version."""
    desired = stack.versions()[DEVICE]
    return {"applied_version": desired[0], "applied_hash": desired[1]}


def test_a_late_report_changes_nothing_and_records_no_event(stack: Stack) -> None:
    stack.rec.run_once("start")
    repaired = {**_applied(stack), "drift": ["table=0 cookie=0x1 missing"], "drift_repaired": True,
                "counters": {"0x1": {"packets": 1, "bytes": 60}}}
    assert not _report(stack, **repaired, report_seq=100).stale  # the repair, audited
    stack.clock.advance(timedelta(seconds=5))
    newer = {**_applied(stack), "counters": {"0x1": {"packets": 9, "bytes": 540}}}
    recorded = _report(stack, **newer, report_seq=101)  # drift gone: audited
    assert recorded.audited and not recorded.stale
    row, events = _row(stack), len(stack.events("device.status"))
    assert row["report_seq"] == 101 and row["drift"] == [] and not row["drift_repaired"]
    stack.clock.advance(timedelta(seconds=5))
    for late in (100, 101, 1):  # the repair's first attempt, processed after its retry; the same number again
        recorded = _report(stack, **repaired, report_seq=late)
        assert recorded.stale and not recorded.audited, late
        assert _row(stack) == row, "a late report overwrote a newer one"
    assert len(stack.events("device.status")) == events
    assert _report(stack, **newer, report_seq=102).stale is False  # the next one in order is stored
    assert _row(stack)["report_seq"] == 102 and _row(stack)["reported_at"] > row["reported_at"]


def test_a_report_without_a_number_is_stored_as_before(stack: Stack) -> None:
    stack.rec.run_once("start")
    assert not _report(stack, **_applied(stack), report_seq=50).stale
    recorded = _report(stack, **_applied(stack), last_error="an agent from before numbering")
    assert recorded.audited and not recorded.stale
    row = _row(stack)
    assert row["last_error"] == "an agent from before numbering" and row["report_seq"] == 50  # kept, not cleared
    assert _report(stack, **_applied(stack), report_seq=50).stale


@pytest.mark.parametrize("seq", [0, -1, 2**63, True, "7", 1.5])
def test_a_report_number_out_of_range_is_invalid(stack: Stack, seq: Any) -> None:
    stack.rec.run_once("start")
    with pytest.raises(InvalidInput, match="report_seq"):
        _report(stack, **_applied(stack), report_seq=seq)
    assert _row(stack)["report_seq"] is None


@pytest.mark.parametrize("newer_audited", [False, True], ids=["counters-only", "audited"])
def test_a_late_report_racing_a_newer_one_changes_nothing(stack: Stack, newer_audited: bool) -> None:
    """The newer report (101) has claimed the row and not committed when the older one (100) reads it: the older one
    waits for it (PostgreSQL: the claim's row lock, or the log lock the audited one holds; SQLite: the writer lock)
    and, the newer one committed, changes nothing. Before, the older one read the row before the newer one committed
    and overwrote it after (its check and its write were two statements)."""
    stack.rec.run_once("start")
    assert not _report(stack, **_applied(stack), report_seq=99).stale
    newer = {**_applied(stack), "counters": {"0x1": {"packets": 9, "bytes": 540}}, "report_seq": 101}
    if newer_audited:
        newer["last_error"] = "newer"
    older = {**_applied(stack), "counters": {"0x1": {"packets": 1, "bytes": 60}}}
    outcome: list[service.StatusRecorded | BaseException] = []

    def send_older() -> None:
        try:
            outcome.append(_report(stack, **older, report_seq=100))
        except BaseException as exc:  # reported by the assertion below
            outcome.append(exc)

    postgres = stack.ctx.db.dialect == "postgresql"
    with stack.ctx.db.session() as s:
        assert not service.record_status(s, DEVICE, newer, actor=NODE, now=stack.clock()).stale
        t = threading.Thread(target=send_older)
        t.start()
        deadline = time.monotonic() + 10
        if postgres:  # until the older one waits for a lock the newer one holds
            while not _waiting_for_a_lock(stack):
                assert time.monotonic() < deadline and t.is_alive(), outcome
                time.sleep(0.02)
        else:
            time.sleep(0.3)
        assert t.is_alive() and not outcome, "the older report did not wait for the newer one"
    t.join(15)
    assert len(outcome) == 1 and isinstance(outcome[0], service.StatusRecorded), outcome
    assert outcome[0].stale
    row = _row(stack)
    assert row["report_seq"] == 101 and row["counters"] == newer["counters"]
    assert row["last_error"] == ("newer" if newer_audited else None)


def _waiting_for_a_lock(stack: Stack) -> bool:
    with stack.ctx.db.engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                      "AND datname = current_database()")).scalar_one())


def test_a_report_numbered_far_ahead_of_the_servers_clock_is_invalid(stack: Stack) -> None:
    """Should fix (review-agentsec): the server took any number up to 2**63-1. One report numbered at the top (a
    buggy or compromised agent) left no number above it: every later report of the device was stale for good, and
    the agent's floor (stored + 1) was refused as out of range. Now a number more than 7 days ahead of the server's
    clock is refused, and the limit itself is taken."""
    stack.rec.run_once("start")
    limit = service.report_seq_limit(stack.clock())
    assert limit == time_ns_of(stack) + 7 * 86_400 * 10**9
    for seq in (2**63 - 1, limit + 1):
        with pytest.raises(InvalidInput, match="ahead of the server's clock"):
            _report(stack, **_applied(stack), report_seq=seq)
        assert _row(stack)["report_seq"] is None
    assert not _report(stack, **_applied(stack), report_seq=limit).stale
    stack.clock.advance(timedelta(seconds=1))  # the agent's floor, stored + 1, is taken a moment later
    assert not _report(stack, **_applied(stack), report_seq=limit + 1).stale


def test_a_stored_number_far_ahead_of_the_servers_clock_binds_nothing(stack: Stack) -> None:
    """Should fix (review-agentsec): a row holding a number the server would refuse now (stored before the bound,
    or by hand) kept every report of the device stale for good; no operator command clears it. Now such a number
    binds no report: the next one is stored, and its number binds from then on."""
    stack.rec.run_once("start")
    assert not _report(stack, **_applied(stack), report_seq=5).stale
    now = time_ns_of(stack)
    for counters_only in (True, False):  # the conditional UPDATE's way, and the locked way (an audited change)
        with stack.ctx.db.session() as s:
            s.execute(text("UPDATE enforcer_devices SET report_seq = :top WHERE device = :d"),
                      {"top": 2**63 - 1, "d": DEVICE})
        report = {**_applied(stack), **({} if counters_only else {"last_error": "seen"})}
        recorded = _report(stack, **report, report_seq=now)
        assert not recorded.stale and recorded.audited is not counters_only, counters_only
        assert _row(stack)["report_seq"] == now
        now += 1
    assert _row(stack)["last_error"] == "seen"
    assert _report(stack, **_applied(stack), report_seq=now - 1).stale  # binding again


def time_ns_of(stack: Stack) -> int:
    return int(stack.clock().timestamp()) * 10**9 + stack.clock().microsecond * 1000
