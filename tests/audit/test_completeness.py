"""Issue 13 item 2: a filtered export proves that no matching event was left out.

Each attack hides matching events behind gap records that carry their true leaf hashes, so the Merkle
root still matches the signed checkpoint; before per-key counters the verifier said OK to all of them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from audit import Actor, record
from audit.errors import BadHeader, Removed, Truncated, Unproven, VerificationError
from audit.export import ExportFilter, export_events
from audit.verify import VerifyReport, verify_export
from store.db import Database, sqlite_url
from store.migrations import migrate as run_steps
from tests.audit.bulk import bulk_fill
from tests.audit.conftest import T0, KeySigner, fill
from workflows.schema import STEPS as MIGRATIONS
from workflows.schema import migrate

N = 90


def _export(db: Database, signer: KeySigner, flt: ExportFilter, fmt: str = "jsonl") -> list[bytes]:
    buf = io.BytesIO()
    export_events(db, signer, buf, fmt=fmt, filters=flt)
    return buf.getvalue().splitlines(keepends=True)


def _verify(lines: list[bytes], signer: KeySigner) -> VerificationError:
    """The verdict of both passes (they must agree) on an edited export."""
    verdicts = []
    for fast in (True, False):
        with pytest.raises(VerificationError) as info:
            verify_export(io.BytesIO(b"".join(lines)), signer.public_key(), fast=fast)
        verdicts.append(info.value)
    assert (verdicts[0].kind, verdicts[0].index) == (verdicts[1].kind, verdicts[1].index)
    return verdicts[0]


def _hide(lines: list[bytes], hidden: Callable[[dict[str, object]], bool]) -> list[bytes]:
    """Replace the events `hidden` selects by gap records carrying their own leaf hashes."""
    out = []
    for line in lines:
        if line.startswith(b'{"event":'):
            rec = json.loads(line)
            if hidden(rec["event"]):
                gap = {"hash": rec["leaf_hash"], "level": 0, "start": rec["event"]["seq"]}
                line = json.dumps({"gap": gap}).encode() + b"\n"
        out.append(line)
    return out


def _events(lines: list[bytes]) -> list[dict[str, object]]:
    return [json.loads(line)["event"] for line in lines if line.startswith(b'{"event":')]


@pytest.fixture
def filled(db: Database) -> Database:
    fill(db, N)
    return db


def test_a_tenant_event_replaced_by_its_gap_hash_is_named(filled: Database, signer: KeySigner) -> None:
    lines = _export(filled, signer, ExportFilter(tenant="acme"))
    victim = _events(lines)[4]["seq"]
    err = _verify(_hide(lines, lambda ev: ev["seq"] == victim), signer)
    assert isinstance(err, Removed) and err.kind == "removed"
    assert "tenant:acme" in str(err) and "#4" in str(err), err


def test_every_event_of_an_action_vanishing_is_named(filled: Database, signer: KeySigner) -> None:
    """The issue's example: all events of an action replaced by gap records."""
    lines = _export(filled, signer, ExportFilter(action="flow.deny"))
    assert len(_events(lines)) == 15
    err = _verify(_hide(lines, lambda ev: True), signer)
    assert isinstance(err, Removed) and "counts 15 'action:flow.deny' event(s) but the export shows none" in str(err)


def test_the_tail_of_a_tenant_action_export_hidden_is_named(filled: Database, signer: KeySigner) -> None:
    lines = _export(filled, signer, ExportFilter(tenant="acme", action="svid.issue"))
    shown = _events(lines)
    assert len(shown) >= 3
    err = _verify(_hide(lines, lambda ev: ev["seq"] == shown[-1]["seq"]), signer)
    assert isinstance(err, Truncated) and err.index == shown[-2]["seq"]


def test_the_first_events_hidden_are_named(filled: Database, signer: KeySigner) -> None:
    lines = _export(filled, signer, ExportFilter(tenant="initech"))
    first = _events(lines)[0]["seq"]
    err = _verify(_hide(lines, lambda ev: ev["seq"] == first), signer)
    assert isinstance(err, Removed) and "#0..#0" in str(err)


def test_a_narrowed_window_cannot_drop_its_context_event(filled: Database, signer: KeySigner) -> None:
    """The matching event just before the window proves that none of the window's is left out; without
    it, the first matching events of the window could be hidden."""
    flt = ExportFilter(tenant="acme", since=T0 + timedelta(seconds=30), until=T0 + timedelta(seconds=70))
    lines = _export(filled, signer, flt)
    shown = _events(lines)
    before = [ev for ev in shown if int(ev["seq"]) < 30]  # type: ignore[call-overload]
    after = [ev for ev in shown if int(ev["seq"]) >= 70]  # type: ignore[call-overload]
    assert len(before) == len(after) == 1  # the context events
    err = _verify(_hide(lines, lambda ev: ev["seq"] in (before[0]["seq"], shown[1]["seq"])), signer)
    assert isinstance(err, Removed)
    err = _verify(_hide(lines, lambda ev: ev["seq"] in (after[0]["seq"], shown[-2]["seq"])), signer)
    assert isinstance(err, Truncated)


def test_a_forged_count_in_the_header_is_refused(filled: Database, signer: KeySigner) -> None:
    lines = _export(filled, signer, ExportFilter(tenant="acme"))
    header = json.loads(lines[0])
    header["header"]["counters"]["entries"][0]["count"] -= 1
    lines[0] = json.dumps(header).encode() + b"\n"
    err = _verify(_hide(lines, lambda ev: ev["seq"] == _events(lines)[-1]["seq"]), signer)
    assert isinstance(err, BadHeader)


def test_a_tenant_with_no_events_is_proven_empty(filled: Database, signer: KeySigner) -> None:
    lines = _export(filled, signer, ExportFilter(tenant="nobody"))
    report = verify_export(io.BytesIO(b"".join(lines)), signer.public_key())
    assert report.events == 0
    header = json.loads(lines[0])
    header["header"]["filter"]["tenant"] = "acme"  # claim it is acme's export: acme has events
    header["header"]["counters"]["key"] = "tenant:acme"
    lines[0] = json.dumps(header).encode() + b"\n"
    assert isinstance(_verify(lines, signer), BadHeader)


def test_a_log_from_before_the_counters_verifies_whole_but_filtered_only_as_unproven(tmp_path: Path) -> None:
    """An existing database (events of version 1, migrated): its events still verify; a filter they
    cannot prove is UNPROVEN, never OK; events appended after the migration are proven again."""
    db = Database(sqlite_url(tmp_path))
    run_steps(db.engine, MIGRATIONS[:5])  # the schema before this change
    bulk_fill(db, 40)  # version 1 events, as the old record() wrote them
    assert migrate(db.engine) == [s.version for s in MIGRATIONS[5:]]  # 6 (the counters), and later steps
    signer = KeySigner()
    whole = _export(db, signer, ExportFilter())
    assert verify_export(io.BytesIO(b"".join(whole)), signer.public_key()).events == 40
    with pytest.raises(Unproven, match="predates the per-key counters") as info:
        verify_export(io.BytesIO(b"".join(_export(db, signer, ExportFilter(tenant="acme")))), signer.public_key())
    checked = info.value.report  # what was checked
    assert isinstance(checked, VerifyReport) and checked.events == 14
    with db.session() as s:
        for i in range(6):
            record(s, actor=Actor("op", "admin"), action="grant.approve", object_type="g", object_id=f"n{i}",
                   tenant="acme")
            record(s, actor=Actor("op", "admin"), action="token.create", object_type="t", object_id=f"t{i}")
    # the new events are counted, but acme's old ones cannot be proven complete: still unproven
    with pytest.raises(Unproven):
        verify_export(io.BytesIO(b"".join(_export(db, signer, ExportFilter(tenant="acme")))), signer.public_key())
    # an action only the new events have: numbered without a hole, yet the older events carry no counters
    with pytest.raises(Unproven, match="events before 40 carry no counters"):
        verify_export(
            io.BytesIO(b"".join(_export(db, signer, ExportFilter(action="token.create")))), signer.public_key()
        )
    assert verify_export(io.BytesIO(b"".join(_export(db, signer, ExportFilter()))), signer.public_key()).events == 52
    db.dispose()
