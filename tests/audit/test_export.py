"""Exports on both databases: every format and filter verifies offline; OCSF events validate."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import TypedDict

import pytest
from py_ocsf_models.events.base_event import BaseEvent
from py_ocsf_models.objects.api import API
from py_ocsf_models.objects.metadata import Metadata
from py_ocsf_models.objects.user import User
from sqlmodel import select

from audit import Actor, record
from audit.errors import InvalidAuditEvent
from audit.export import ExportFilter, export_events, ocsf
from audit.export.csv import unguarded
from audit.models import AuditCheckpoint
from audit.verify import verify_export
from store.db import Database
from tests.audit.conftest import T0, KeySigner, fill

FILTERS = [
    ExportFilter(),
    ExportFilter(tenant="acme"),
    ExportFilter(action="flow.deny"),
    ExportFilter(tenant="globex", action="svid.issue"),
    ExportFilter(since=T0 + timedelta(seconds=17), until=T0 + timedelta(seconds=71)),
    ExportFilter(since=T0 + timedelta(seconds=40), tenant="initech"),
    ExportFilter(until=T0 + timedelta(seconds=33)),
    ExportFilter(since=T0 + timedelta(days=9)),  # nothing selected: all gaps
    ExportFilter(tenant="nobody"),
]


class _Event(TypedDict):
    seq: int
    tenant: str | None
    action: str


def _expected(f: ExportFilter, events: list[_Event]) -> list[int]:
    out = []
    for e in events:
        ts = T0 + timedelta(seconds=e["seq"])
        if (f.since and ts < f.since) or (f.until and ts >= f.until):
            continue
        if (f.tenant and e["tenant"] != f.tenant) or (f.action and e["action"] != f.action):
            continue
        out.append(e["seq"])
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "ocsf"])
def test_every_filter_exports_exactly_its_events_and_verifies(db: Database, signer: KeySigner, fmt: str) -> None:
    events = [_Event(seq=e.seq, tenant=e.tenant, action=e.action) for e in fill(db, 90)]
    for f in FILTERS:
        buf = io.BytesIO()
        result = export_events(db, signer, buf, fmt=fmt, filters=f)
        report = verify_export(io.BytesIO(buf.getvalue()), signer.public_key())
        want = _expected(f, events)
        assert result.events == report.events == len(want), f
        assert report.tree_size == 90
        if fmt == "jsonl":
            shown = [
                json.loads(line)["event"]["seq"] for line in buf.getvalue().splitlines() if line.startswith(b'{"event"')
            ]
            assert [seq for seq in shown if result.start <= seq < result.end] == want
            # a time window also shows the event just outside each cut bound (context): any event when it
            # does not narrow, the filter's matching one when it does
            context = [seq for seq in shown if not result.start <= seq < result.end]
            matching = [e["seq"] for e in events if _expected(ExportFilter(tenant=f.tenant, action=f.action), [e])]
            earlier = [seq for seq in matching if seq < result.start]
            later = [seq for seq in matching if seq >= result.end]
            expect = [earlier[-1]] if f.since and earlier else []
            expect += [later[0]] if f.until and later else []
            assert context == expect, f
        if not f.narrows:
            assert result.gaps <= 2 * 8  # a time range costs O(log n) gap hashes, an unfiltered export none
    with db.read_session() as s:
        assert len(s.exec(select(AuditCheckpoint)).all()) == 1  # every export checkpoints; same size reused


def test_export_of_an_empty_log(db: Database, signer: KeySigner) -> None:
    buf = io.BytesIO()
    result = export_events(db, signer, buf)
    assert (result.tree_size, result.events) == (0, 0)
    assert verify_export(io.BytesIO(buf.getvalue()), signer.public_key()).tree_size == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"filters": ExportFilter(tenant="Bad Tenant")}, "slug"),
        ({"filters": ExportFilter(action="nope")}, "action"),
        ({"filters": ExportFilter(since=T0.replace(tzinfo=None))}, "timezone"),
        ({"filters": ExportFilter(since=T0, until=T0)}, "before"),
        ({"fmt": "xml"}, "format"),
    ],
)
def test_bad_export_request_writes_nothing(
    sqlite_db: Database, signer: KeySigner, kwargs: dict[str, object], message: str
) -> None:
    fill(sqlite_db, 5)
    buf = io.BytesIO()
    with pytest.raises(InvalidAuditEvent, match=message):
        export_events(sqlite_db, signer, buf, **kwargs)  # type: ignore[arg-type]
    assert buf.getvalue() == b""
    with sqlite_db.read_session() as s:
        assert s.exec(select(AuditCheckpoint)).first() is None


def test_progress_is_reported(sqlite_db: Database, signer: KeySigner) -> None:
    fill(sqlite_db, 30)
    seen: list[tuple[int, int]] = []
    export_events(sqlite_db, signer, io.BytesIO(), batch=7, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (30, 30) and len(seen) == 5


def test_csv_is_a_plain_table(sqlite_db: Database, signer: KeySigner) -> None:
    fill(sqlite_db, 10)
    buf = io.BytesIO()
    export_events(sqlite_db, signer, buf, fmt="csv")
    rows = list(csv.DictReader(io.StringIO(buf.getvalue().decode())))
    assert rows[0]["record"] == "header"
    events = [r for r in rows if r["record"] == "event"]
    assert [int(r["seq"]) for r in events] == list(range(10))
    assert events[1]["tenant"] == "globex" and events[0]["tenant"] == ""


def _validate_ocsf(event: dict[str, object]) -> None:
    BaseEvent.model_validate(event)
    Metadata.model_validate(event["metadata"])
    User.model_validate(event["actor"]["user"])  # type: ignore[index]
    if event["class_uid"] == ocsf.API_ACTIVITY[0]:
        API.model_validate(event["api"])
    assert event["type_uid"] == int(event["class_uid"]) * 100 + int(event["activity_id"])  # type: ignore[call-overload]
    assert event["category_uid"] == int(event["class_uid"]) // 1000  # type: ignore[call-overload]
    required = {
        ocsf.ENTITY_MANAGEMENT[0]: {"entity", "actor"},
        ocsf.AUTHORIZE_SESSION[0]: {"user"},
        ocsf.NETWORK_ACTIVITY[0]: {"src_endpoint", "dst_endpoint"},
        ocsf.API_ACTIVITY[0]: {"api", "actor", "src_endpoint"},
    }[int(event["class_uid"])]  # type: ignore[call-overload]
    assert required <= event.keys()
    assert isinstance(event["time"], int)


def test_ocsf_events_validate_and_map_to_their_classes(sqlite_db: Database, signer: KeySigner) -> None:
    from audit import Actor, record

    fill(sqlite_db, 12)
    with sqlite_db.session() as s:
        for action, summary in [
            ("audit.export", {}),
            ("policy.decision", {"decision": "deny", "src": "spiffe://td/a", "dst": "spiffe://td/b"}),
            ("jwtsvid.issue", {}),
            ("tenant.delete", {}),
            ("widget.frobnicate", {}),
            ("svid.jwt.issue", {}),
            ("ca.init", {}),
            ("tenant.quarantine", {}),
        ]:
            record(
                s,
                actor=Actor("bob", "auditor"),
                action=action,
                object_type="x",
                object_id="y",
                summary=summary,
                request_id="r-1",
            )
    buf = io.BytesIO()
    export_events(sqlite_db, signer, buf, fmt="ocsf")
    events = [json.loads(line) for line in buf.getvalue().splitlines()[1:]]
    for event in events:
        _validate_ocsf(event)
    by_action = {e["unmapped"]["trustfabric"]["event"]["action"]: e for e in events}
    assert by_action["flow.allow"]["class_uid"] == 4001
    assert (by_action["flow.allow"]["disposition_id"], by_action["flow.allow"]["activity_id"]) == (1, 1)
    assert (by_action["flow.deny"]["disposition_id"], by_action["flow.deny"]["action"]) == (2, "Denied")
    assert by_action["policy.decision"]["disposition"] == "Blocked"
    assert by_action["svid.issue"]["class_uid"] == by_action["jwtsvid.issue"]["class_uid"] == 3003
    assert by_action["audit.export"]["class_uid"] == 6003 and by_action["audit.export"]["activity_id"] == 2
    assert by_action["tenant.create"]["type_uid"] == 300401
    assert by_action["tenant.delete"]["activity_name"] == "Delete"
    assert by_action["policy.activate"]["activity_id"] == 3
    assert by_action["widget.frobnicate"]["activity_id"] == 99
    assert by_action["svid.jwt.issue"]["class_uid"] == 3003
    assert by_action["ca.init"]["activity_name"] == "Create"
    assert by_action["tenant.quarantine"]["activity_name"] == "Update"
    assert by_action["audit.export"]["metadata"]["correlation_uid"] == "r-1"
    assert by_action["svid.issue"]["metadata"]["tenant_uid"] == "acme"


def test_ocsf_validation_catches_a_broken_event() -> None:
    """The OCSF check used above is not vacuous."""
    good = ocsf.to_ocsf(
        {
            "v": 1,
            "seq": 0,
            "ts": "2026-01-01T00:00:00.000000Z",
            "actor": {"id": "a", "kind": "admin"},
            "tenant": None,
            "action": "tenant.create",
            "object": {"type": "tenant", "id": "t"},
            "summary": {},
            "reason": None,
            "request_id": None,
            "prev_hash": "0" * 64,
        },
        "1" * 64,
        origin="o",
    )
    _validate_ocsf(good)
    broken = {k: v for k, v in good.items() if k != "metadata"}
    with pytest.raises(Exception):
        _validate_ocsf(broken)
    broken = {**good, "severity_id": 42}
    with pytest.raises(Exception):
        _validate_ocsf(broken)


def test_time_filters_mean_the_same_instant_in_any_zone(db: Database, signer: KeySigner) -> None:
    from datetime import timezone

    from audit import service

    fill(db, 40)
    plus2 = timezone(timedelta(hours=2))
    utc_f = ExportFilter(since=T0 + timedelta(seconds=10), until=T0 + timedelta(seconds=20))
    zoned = ExportFilter(
        since=(T0 + timedelta(seconds=10)).astimezone(plus2), until=(T0 + timedelta(seconds=20)).astimezone(plus2)
    )
    a, b = io.BytesIO(), io.BytesIO()
    ra = export_events(db, signer, a, filters=utc_f)
    rb = export_events(db, signer, b, filters=zoned)
    assert (ra.start, ra.end, ra.events) == (rb.start, rb.end, rb.events) == (10, 20, 10)
    with db.read_session() as s:
        listed = service.list_events(s, since=zoned.since, until=zoned.until)
    assert [e.seq for e in listed] == list(range(10, 20))


@pytest.mark.parametrize("reason", ["a\rb", "ends with a CR\r", "\r", "a\r\nb", "a\nb"])
def test_a_carriage_return_in_caller_text_keeps_the_csv_verifiable(
    sqlite_db: Database, signer: KeySigner, reason: str
) -> None:
    """A revocation reason or justification is the caller's text: a bare CR in it went out unquoted (the csv
    module quotes only its lineterminator's characters), every reader took it for a line break, and the whole
    export failed to verify (Malformed)."""
    fill(sqlite_db, 3)
    with sqlite_db.session() as s:
        record(s, actor=Actor("alice", "tenant", "acme"), action="grant.revoke", object_type="grant",
               object_id="g-1", tenant="acme", summary={"state": "revoked"}, reason=reason, at=T0)
    fill(sqlite_db, 2, start=4)
    buf = io.BytesIO()
    export_events(sqlite_db, signer, buf, fmt="csv")
    for fast in (True, False):
        assert verify_export(io.BytesIO(buf.getvalue()), signer.public_key(), fast=fast).events == 6
    rows = list(csv.DictReader(io.StringIO(buf.getvalue().decode(), newline="")))
    assert [unguarded(r["reason"]) for r in rows if r["object_id"] == "g-1"] == [reason]
