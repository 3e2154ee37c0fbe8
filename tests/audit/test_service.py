"""record(): validation, chain, the stored tree and its proofs, transactions (both real databases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import col, select

from audit import Actor, merkle, record, service
from audit.errors import InvalidAuditEvent, ProofError
from audit.models import AuditEvent, AuditNode
from core.canonical import canonical_json
from core.errors import InvalidInput
from store.db import Database
from tests.audit.conftest import T0, fill

ADMIN = Actor("alice", "admin")


def _leaves(db: Database) -> list[bytes]:
    with db.read_session() as s:
        return [bytes.fromhex(e.leaf_hash) for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]


def _count(db: Database) -> int:
    with db.read_session() as s:
        return len(s.exec(select(AuditEvent.seq)).all())


def test_events_form_a_chain_of_canonical_leaves(db: Database) -> None:
    events = fill(db, 40)
    with db.read_session() as s:
        stored = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [e.seq for e in stored] == list(range(40))
    prev = service.GENESIS_HASH
    for e, returned in zip(stored, events, strict=True):
        assert e.prev_hash == prev
        doc = service.event_document(e)
        assert canonical_json(doc).decode() == e.data  # the stored bytes are RFC 8785 of the row's fields
        assert merkle.hash_leaf(e.data.encode()).hex() == e.leaf_hash == returned.leaf_hash
        assert e.ts.tzinfo is not None or db.dialect == "sqlite"
        prev = e.leaf_hash


def test_stored_tree_gives_every_root_and_proof(db: Database) -> None:
    fill(db, 70)
    leaves = _leaves(db)
    with db.read_session() as s:
        size, root = service.head_root(s)
        assert size == 70 and root == merkle.root_from_leaf_hashes(leaves)
        for n in (1, 2, 3, 31, 32, 33, 64, 69, 70):
            assert service.root_at(s, n) == merkle.root_from_leaf_hashes(leaves[:n])
            for i in {0, n // 2, n - 1}:
                proof = service.inclusion_proof(s, i, n)
                assert proof == merkle.inclusion_proof_from_leaves(leaves, i, n)
                merkle.verify_inclusion(i, n, leaves[i], proof, service.root_at(s, n))
            for m in {1, n // 3 or 1, n}:
                proof = service.consistency_proof(s, m, n)
                merkle.verify_consistency(m, n, service.root_at(s, m), service.root_at(s, n), proof)
        with pytest.raises(ProofError):
            service.root_at(s, 71)
        with pytest.raises(ProofError):
            service.inclusion_proof(s, 70, 70)
        # one node row per completed subtree of level >= 1: 70 leaves complete 35+17+8+4+2+1
        assert len(s.exec(select(AuditNode.key)).all()) == 35 + 17 + 8 + 4 + 2 + 1


def test_proofs_read_only_log_n_rows(sqlite_db: Database) -> None:
    fill(sqlite_db, 300, per_tx=300)
    statements: list[str] = []
    from sqlalchemy import event

    def _count_stmt(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(sqlite_db.engine, "before_cursor_execute", _count_stmt)
    try:
        with sqlite_db.read_session() as s:
            statements.clear()
            service.inclusion_proof(s, 123, 299)
    finally:
        event.remove(sqlite_db.engine, "before_cursor_execute", _count_stmt)
    assert len(statements) <= 4  # head size, leaves, nodes -- never a scan of the events


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "Bad Action"}, "noun.verb"),
        ({"action": "nodot"}, "noun.verb"),
        ({"object_type": ""}, "object type"),
        ({"object_id": "x" * 513}, "object id"),
        ({"tenant": "Not_A_Slug"}, "slug"),
        ({"summary": {"x": float("nan")}}, "canonical JSON"),
        ({"summary": {"x": 2**60}}, "canonical JSON"),
        ({"summary": ["not", "an", "object"]}, "JSON object"),
        ({"at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"reason": "r" * 2001}, "reason"),
        ({"actor": Actor("x", "wizard")}, "actor kind"),  # type: ignore[arg-type]
        ({"actor": Actor("", "admin")}, "actor id"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(db: Database, kwargs: dict[str, object], message: str) -> None:
    fill(db, 3)
    args: dict[str, object] = {"actor": ADMIN, "action": "tenant.create", "object_type": "tenant", "object_id": "acme"}
    args.update(kwargs)
    with pytest.raises(InvalidAuditEvent, match=message) as info, db.session() as s:
        record(s, **args)  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidInput)
    assert _count(db) == 3
    # the log continues contiguously afterwards
    with db.session() as s:
        assert record(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="x").seq == 3


def test_event_commits_with_its_change_or_not_at_all(db: Database) -> None:
    fill(db, 2)
    with pytest.raises(RuntimeError), db.session() as s:
        record(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="doomed")
        raise RuntimeError("the change failed after its event was recorded")
    assert _count(db) == 2
    with db.read_session() as s:
        assert service.tree_size(s) == 2
        assert service.head_root(s)[1] == merkle.root_from_leaf_hashes(_leaves(db))
    fill(db, 3, start=2)
    assert _count(db) == 5


def test_savepoint_rollback_keeps_the_log_contiguous(db: Database) -> None:
    with db.session() as s:
        record(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="a")
        nested = s.begin_nested()
        record(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="rolled-back")
        nested.rollback()
        third = record(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="b")
    assert third.seq == 1
    with db.read_session() as s:
        rows = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [r.object_id for r in rows] == ["a", "b"]
    assert rows[1].prev_hash == rows[0].leaf_hash


def test_times_are_utc_and_round_trip_exactly(db: Database) -> None:
    from datetime import timezone

    paris = timezone(timedelta(hours=1))
    with db.session() as s:
        ev = record(
            s,
            actor=ADMIN,
            action="tenant.create",
            object_type="tenant",
            object_id="a",
            at=datetime(2026, 3, 1, 13, 0, 0, 123456, tzinfo=paris),
        )
    assert ev.ts == datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    with db.read_session() as s:
        row = s.exec(select(AuditEvent)).one()
    assert '"ts":"2026-03-01T12:00:00.123456Z"' in row.data
    assert service.event_document(row) == service.event_document(ev)


def test_summary_is_stored_as_it_was_hashed(sqlite_db: Database) -> None:
    with sqlite_db.session() as s:
        ev = record(
            s,
            actor=ADMIN,
            action="policy.activate",
            object_type="policy",
            object_id="p1",
            summary={"b": (1, 2), "a": {"z": None, "é": "ü"}},
            at=T0,
        )
    assert ev.summary == {"a": {"z": None, "é": "ü"}, "b": [1, 2]}
    with sqlite_db.read_session() as s:
        row = s.exec(select(AuditEvent)).one()
    assert service.leaf_hash(service.event_document(row)) == row.leaf_hash


def test_format_ts_pads_early_years_and_round_trips() -> None:
    """strftime('%Y') gives '999' for year 999, which fromisoformat refuses: an export filtered from such
    a date failed (found by the mutation walk's generated inputs)."""
    from datetime import UTC, datetime

    from audit.service import format_ts

    for ts in (datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC), datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)):
        text = format_ts(ts)
        assert text.endswith("Z") and len(text) == 27
        assert datetime.fromisoformat(text.replace("Z", "+00:00")) == ts


def test_record_only_checks_and_appends_as_record_does(db: Database) -> None:
    """record_only (no event object back) refuses what record refuses, writing nothing, and appends the same event:
    the same document, hashed and chained as record's."""
    fill(db, 2)
    with pytest.raises(InvalidAuditEvent, match=r"noun\.verb"), db.session() as s:
        service.record_only(s, actor=ADMIN, action="Bad Action", object_type="tenant", object_id="acme")
    with pytest.raises(InvalidAuditEvent, match="canonical JSON"), db.session() as s:
        service.record_only(s, actor=ADMIN, action="tenant.create", object_type="tenant", object_id="acme",
                            summary={"x": float("nan")})
    assert _count(db) == 2
    summary = {"serial": "7f", "n": 3, "ok": True, "none": None, "nested": {"a": [1, "b"]}}
    with db.session() as s:
        service.record_only(s, actor=ADMIN, action="svid.issue", object_type="svid", object_id="7f",
                            tenant="acme", summary=summary, at=T0)
        returned = record(s, actor=ADMIN, action="svid.issue", object_type="svid", object_id="80", tenant="acme",
                          summary=summary, at=T0)
    with db.read_session() as s:
        rows = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [r.seq for r in rows] == [0, 1, 2, 3] and returned.seq == 3
    assert rows[3].prev_hash == rows[2].leaf_hash and rows[2].prev_hash == rows[1].leaf_hash
    for row in rows[2:]:
        assert row.summary == summary
        assert service.leaf_hash(service.event_document(row)) == row.leaf_hash
    doc2, doc3 = service.event_document(rows[2]), service.event_document(rows[3])
    assert {k: v for k, v in doc2.items() if k not in ("seq", "object", "prev_hash", "counters")} == {
        k: v for k, v in doc3.items() if k not in ("seq", "object", "prev_hash", "counters")}
    assert doc3["counters"] == {k: n + 1 for k, n in doc2["counters"].items()}


def test_a_flat_summary_is_copied_not_shared(sqlite_db: Database) -> None:
    """A summary of plain scalars is kept as a copy (not parsed back from its JSON): the caller changing its dict
    afterwards changes neither the event returned nor what is hashed."""
    summary: dict[str, object] = {"serial": "7f", "n": 3, "ok": False, "none": None}
    with sqlite_db.session() as s:
        ev = record(s, actor=ADMIN, action="svid.issue", object_type="svid", object_id="7f", summary=summary, at=T0)
        summary["serial"] = "changed"
        summary["extra"] = 1
    assert ev.summary == {"serial": "7f", "n": 3, "ok": False, "none": None}
    with sqlite_db.read_session() as s:
        row = s.exec(select(AuditEvent)).one()
    assert row.summary == ev.summary
    assert service.leaf_hash(service.event_document(row)) == row.leaf_hash == ev.leaf_hash


def test_events_since_except_gives_the_ends_and_every_other_action(db: Database) -> None:
    """(seq, action, leaf) of the first and the last event of the range and of every event between whose action is
    not in `common`: on PostgreSQL straight from the driver, elsewhere through SQLAlchemy; the same answer."""
    actions = ["svid.issue", "tenant.create", "svid.issue", "svid.issue", "grant.request", "svid.issue",
               "tenant.delete", "svid.issue"]
    with db.session() as s:
        for k, action in enumerate(actions):
            record(s, actor=ADMIN, action=action, object_type="x", object_id=str(k), at=T0)
    leaves = [leaf.hex() for leaf in _leaves(db)]
    cases = [(0, 8, frozenset({"svid.issue"})), (1, 7, frozenset({"svid.issue", "grant.request"})),
             (2, 4, frozenset({"svid.issue"})), (3, 4, frozenset()), (0, 8, frozenset()), (5, 5, frozenset()),
             (0, 8, frozenset({"svid.issue", "tenant.create", "tenant.delete", "grant.request"}))]
    with db.session() as s:
        for since, until, common in cases:
            want = [(seq, actions[seq], leaves[seq]) for seq in range(since, until)
                    if seq in (since, until - 1) or actions[seq] not in common]
            assert service.events_since_except(s, since, until, common) == want, (since, until, common)
