"""Issue 13 item 3: event times never go backwards (set at append, under the head lock, to the full
precision), and the verifier checks their order."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from audit import Actor, record
from audit.errors import Removed, TimeReversed, VerificationError
from audit.export import ExportFilter, export_events
from audit.models import AuditEvent
from audit.verify import verify_export
from store.db import Database
from tests.audit.conftest import T0, KeySigner

ADMIN = Actor("alice", "admin")


def _append(db: Database, n: int, at_seconds: float) -> None:
    with db.session() as s:
        record(s, actor=ADMIN, action="token.create", object_type="t", object_id=f"t{n}",
               at=T0 + timedelta(seconds=at_seconds))


def test_a_time_truncated_to_the_second_does_not_go_back(db: Database) -> None:
    """token.create passes its time cut to the second: the event keeps the full precision of the last one."""
    _append(db, 0, 5.75)
    _append(db, 1, 5)  # what clock().replace(microsecond=0) gives 0.75 s later
    _append(db, 2, 7.5)
    with db.read_session() as s:
        times = [e.ts.replace(tzinfo=None) for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]
    assert times == sorted(times)
    assert [t - T0.replace(tzinfo=None) for t in times] == [timedelta(seconds=s) for s in (5.75, 5.75, 7.5)]


def test_times_stay_ordered_across_transactions_and_batches(db: Database) -> None:
    with db.session() as s:
        for i, at in enumerate((3, 9, 1, 9.5, 2)):
            record(s, actor=ADMIN, action="tenant.create", object_type="t", object_id=f"a{i}",
                   at=T0 + timedelta(seconds=at))
    _append(db, 9, 0)
    with db.read_session() as s:
        docs = [json.loads(e.data) for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]
    assert [d["ts"] for d in docs] == sorted(d["ts"] for d in docs)


def _window_hiding_attack(lines: list[bytes], since_seq: int) -> list[bytes]:
    """The export of the window starting with event `since_seq`, edited to start one event later: the
    event at since_seq becomes a gap and the event after it is shown as the window's context."""
    out = []
    for line in lines:
        if line.startswith(b'{"header":'):
            header = json.loads(line)
            header["header"]["range"]["start"] += 2
            line = json.dumps(header).encode() + b"\n"
        elif line.startswith(b'{"event":'):
            rec = json.loads(line)
            if rec["event"]["seq"] in (since_seq - 1, since_seq):
                gap = {"hash": rec["leaf_hash"], "level": 0, "start": rec["event"]["seq"]}
                line = json.dumps({"gap": gap}).encode() + b"\n"
        out.append(line)
    return out


def test_a_truncated_time_cannot_hide_an_event_as_the_windows_context(sqlite_db: Database) -> None:
    """Events at 10 s, 20 s, then one whose time was cut back to 12 s: a window from 15 s starts with the
    20 s event. With times going back, the 12 s event could pose as the context just before the window
    and the 20 s event vanish behind a gap; with a monotonic clock it stands at 20 s and gives it away."""
    for n, at in enumerate((10, 20, 12, 30)):
        _append(sqlite_db, n, at)
    signer = KeySigner()
    buf = io.BytesIO()
    export_events(sqlite_db, signer, buf, filters=ExportFilter(since=T0 + timedelta(seconds=15)))
    lines = buf.getvalue().splitlines(keepends=True)
    assert json.loads(lines[0])["header"]["range"] == {"start": 1, "end": 4}
    attacked = _window_hiding_attack(lines, 1)
    for fast in (True, False):
        with pytest.raises(Removed, match="inside the window"):
            verify_export(io.BytesIO(b"".join(attacked)), signer.public_key(), fast=fast)


def test_the_verifier_refuses_times_that_go_back(sqlite_db: Database) -> None:
    """A log written by a writer without the monotonic clock (the head's last time set back between
    appends): both passes name the first event whose time is earlier than one before it."""
    for n, at in enumerate((1, 2, 3)):
        _append(sqlite_db, n, at)
    with sqlite_db.session() as s:
        s.connection().execute(text("UPDATE audit_head SET last_ts = NULL"))
    _append(sqlite_db, 3, 0.5)
    _append(sqlite_db, 4, 4)
    signer = KeySigner()
    for flt in (ExportFilter(), ExportFilter(action="token.create"), ExportFilter(since=T0)):
        buf = io.BytesIO()
        export_events(sqlite_db, signer, buf, filters=flt)
        verdicts = []
        for fast in (True, False):
            with pytest.raises(VerificationError) as info:
                verify_export(io.BytesIO(buf.getvalue()), signer.public_key(), fast=fast)
            verdicts.append(info.value)
        assert all(isinstance(v, TimeReversed) and v.index == 3 for v in verdicts), verdicts
