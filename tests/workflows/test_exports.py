"""export_audit: one workflow behind `POST /v1/audit/exports` and `trustfabric audit export`: the export,
the decision records on request, and the audit.export event, recorded only once every file is written."""

from __future__ import annotations

import io

import pytest
from sqlmodel import col, select

from audit import Actor
from audit.export import ExportFilter
from audit.models import AuditEvent
from core.errors import InvalidInput
from workflows.context import AppContext
from workflows.exports import export_audit, log_origin
from workflows.init import initialize

AUDITOR = Actor("auditor-1", "auditor")


def _last_event(ctx: AppContext) -> AuditEvent:
    with ctx.db.read_session() as s:
        return s.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc())).first()  # type: ignore[return-value]


def test_the_api_and_the_cli_shapes_of_the_event(ctx: AppContext) -> None:
    initialize(ctx, "example.org", "ec-p256")
    assert log_origin(ctx) == "example.org/audit"
    out, decisions = io.BytesIO(), io.BytesIO()
    done = export_audit(ctx, out, fmt="jsonl", filters=ExportFilter(), actor=AUDITOR, decisions_out=decisions,
                        request_id="r-9")
    event = _last_event(ctx)
    assert (event.action, event.actor_id, event.request_id) == ("audit.export", "auditor-1", "r-9")
    assert event.summary == {"filter": ExportFilter().as_json(), "tree_size": done.events.tree_size,
                             "events": done.events.events,
                             "decisions": {"count": 0, "sha256": done.decisions.sha256}}  # type: ignore[union-attr]
    assert out.getvalue() and decisions.getvalue()

    export_audit(ctx, io.BytesIO(), fmt="csv", filters=ExportFilter(), actor=AUDITOR, file_names=("a.csv", "b"))
    event = _last_event(ctx)
    assert event.summary["out"] == "a.csv" and "events" not in event.summary and "decisions" not in event.summary


def test_a_bad_filter_writes_and_records_nothing(ctx: AppContext) -> None:
    initialize(ctx, "example.org", "ec-p256")
    before = _last_event(ctx).seq
    out = io.BytesIO()
    with pytest.raises(InvalidInput):
        export_audit(ctx, out, fmt="jsonl", filters=ExportFilter(tenant="Not_A_Slug"), actor=AUDITOR,
                     decisions_out=io.BytesIO())
    assert out.getvalue() == b"" and _last_event(ctx).seq == before
