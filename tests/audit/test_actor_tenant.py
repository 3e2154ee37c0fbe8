"""An event's actor names its tenant (acme's `alice` and globex's `alice` are two actors), and everything the log
held before keeps its exact bytes and verifies: the exports the old code wrote (tests/audit/fixtures/
pre_actor_tenant/, made by its generate.py at the commit before the change), and a database it wrote, upgraded by
schema step 15, online (rows, proofs, the console's check) and through new exports that mix both forms."""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from py_ocsf_models.objects.user import User

from audit import Actor, record
from audit.checkpoint import public_key_pem, write_checkpoint
from audit.errors import InvalidAuditEvent, Modified
from audit.export import ExportFilter, export_events
from audit.export.csv import CSV_COLUMNS, V2_COLUMNS, V3_COLUMNS
from audit.models import AuditEvent
from audit.note import load_public_key
from audit.service import event_document, inclusion_proof, list_events
from audit.verify import verify_export
from core.canonical import canonical_json
from store.db import Database, sqlite_url
from store.migrations import migrate as run
from tests.audit.conftest import KeySigner
from tests.audit.oldform import append_document
from tests.conftest import PostgresServer
from workflows.schema import STEPS, migrate

FIXTURES = Path(__file__).parent / "fixtures" / "pre_actor_tenant"
OLD_EXPORTS = ("all.jsonl", "all.csv", "all.ocsf.jsonl", "acme.jsonl", "acme.csv", "acme.ocsf.jsonl")
ORIGIN = "trustfabric.test/audit"
LATER = datetime(2026, 4, 1, tzinfo=UTC)


def _old_events() -> list[bytes]:
    """The exact bytes of the events the old code wrote (its whole JSONL export)."""
    out = []
    for line in (FIXTURES / "all.jsonl").read_bytes().splitlines():
        if line.startswith(b'{"event":'):
            out.append(line[len(b'{"event":'): line.rindex(b',"leaf_hash":')])
    return out


@pytest.mark.parametrize("name", OLD_EXPORTS)
@pytest.mark.parametrize("fast", [True, False])
def test_exports_written_before_still_verify(name: str, fast: bool) -> None:
    key = load_public_key((FIXTURES / "audit.pub").read_bytes())
    report = verify_export(FIXTURES / name, key, fast=fast)
    assert report.tree_size == 11 and report.events == (11 if name.startswith("all") else 6)


def test_the_old_events_name_no_actor_tenant() -> None:
    """What the fixtures hold (so the tests above prove something): tenant actors, acme's and globex's `alice`
    among them, in the form without a tenant; the CSV with the columns of its time."""
    actors = [json.loads(data)["actor"] for data in _old_events()]
    assert {"id": "alice", "kind": "tenant"} in actors and all(set(a) == {"id", "kind"} for a in actors)
    assert (FIXTURES / "all.csv").read_text().splitlines()[0].split(",") == list(V2_COLUMNS)


def _db_at_step_14(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if backend == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        db = Database(server.create_database(migrated=False))
    else:
        db = Database(sqlite_url(tmp_path))
    assert run(db.engine, [s for s in STEPS if s.version < 15])[-1] == 14
    return db


def _online_check(db: Database, signer: KeySigner) -> None:
    """Every event as the API and the console read it (its document rebuilt from its row) hashes to its leaf, and
    the console's check of it (leaf, inclusion proof, signed checkpoint) passes."""
    from api.console.pages_audit import check_inclusion
    from api.routes.audit import event_out

    cp = write_checkpoint(db, signer, origin=ORIGIN, clock=lambda: LATER)
    checkpoint = {"note": cp.note, "origin": cp.origin, "public_key": public_key_pem(signer)}
    with db.read_session() as s:
        for row in list_events(s, limit=1000):
            assert canonical_json(event_document(row)).decode() == row.data
            proof = {"leaf_hash": base64.b64encode(bytes.fromhex(row.leaf_hash)).decode(), "tree_size": cp.size,
                     "proof": [base64.b64encode(h).decode() for h in inclusion_proof(s, row.seq, cp.size)]}
            steps = check_inclusion(event_out(row).model_dump(mode="json"), checkpoint, proof)
            assert [ok for _what, ok, _detail in steps] == [True, True, True], (row.seq, steps)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_log_written_before_verifies_after_the_upgrade_and_grows(backend: str, request: pytest.FixtureRequest,
                                                                   tmp_path: Path) -> None:
    old = _old_events()
    db = _db_at_step_14(backend, request, tmp_path)
    signer = KeySigner()
    try:
        with db.session() as s:
            for data in old:
                append_document(s.connection(), data)
        assert migrate(db.engine) == [step.version for step in STEPS if step.version > 14]  # every later step
        with db.read_session() as s:
            rows = list_events(s, limit=1000)
        assert [r.data.encode() for r in rows] == old and {r.actor_tenant for r in rows} == {None}
        _online_check(db, signer)

        with db.session() as s:  # the same `alice` of two tenants, now told apart
            record(s, actor=Actor("alice", "tenant", "acme"), action="grant.request", object_type="grant",
                   object_id="g-2", tenant="acme", at=LATER)
            record(s, actor=Actor("alice", "tenant", "globex"), action="grant.approve", object_type="grant",
                   object_id="g-2", tenant="acme", at=LATER)
            record(s, actor=Actor("cli:root", "admin"), action="tenant.update", object_type="tenant",
                   object_id="acme", tenant="acme", at=LATER)
        with db.read_session() as s:
            rows = list_events(s, limit=1000)
        assert [r.data.encode() for r in rows[:11]] == old, "appends never touch what is there"
        new = [json.loads(r.data)["actor"] for r in rows[11:]]
        assert new == [{"id": "alice", "kind": "tenant", "tenant": "acme"},
                       {"id": "alice", "kind": "tenant", "tenant": "globex"},
                       {"id": "cli:root", "kind": "admin"}]  # no tenant: no key, as before
        _online_check(db, signer)

        key = signer.public_key()
        for fmt in ("jsonl", "csv", "ocsf"):
            for flt, shown in ((ExportFilter(), 14), (ExportFilter(tenant="acme"), 9)):
                buf = io.BytesIO()
                export_events(db, signer, buf, fmt=fmt, filters=flt, origin=ORIGIN, clock=lambda: LATER)
                for fast in (True, False):
                    report = verify_export(io.BytesIO(buf.getvalue()), key, fast=fast)
                    assert (report.tree_size, report.events) == (14, shown), (fmt, flt)
    finally:
        db.dispose()


def test_the_actor_filter_tells_tenants_apart(sqlite_db: Database) -> None:
    """`alice@acme` is acme's alice; `alice` is every alice (the old, tenant-less ones too); actor_tenant is the
    bare id within a tenant, or every actor of it."""
    with sqlite_db.session() as s:
        for data in _old_events():  # a log from before: its alices name no tenant
            append_document(s.connection(), data)
        for actor, oid in ((Actor("alice", "tenant", "acme"), "a"), (Actor("alice", "tenant", "globex"), "b"),
                           (Actor("alice@acme", "admin"), "c"), (Actor("alice@acme", "tenant", "globex"), "d"),
                           (Actor("bob", "tenant", "acme"), "e"),
                           (Actor("spiffe://td/tenant/acme/group/web/w1", "workload", "acme"), "f")):
            record(s, actor=actor, action="thing.touch", object_type="thing", object_id=oid, tenant="acme")

    def found(actor: str | None, actor_tenant: str | None = None) -> list[str]:
        with sqlite_db.read_session() as s:
            rows = list_events(s, actor=actor, actor_tenant=actor_tenant, limit=1000)
        return [r.object_id if r.seq >= 11 else f"old-{r.seq}" for r in rows]

    old_alices = [f"old-{seq}" for seq in (2, 3, 4, 5)]
    assert found("alice@acme") == ["a", "c"], "acme's alice, and an actor of no tenant of that very id"
    assert found("alice@globex") == ["b"]
    assert found("alice") == [*old_alices, "a", "b"]
    assert found("alice", "acme") == ["a"]
    assert found("alice@acme", "globex") == ["d"], "with actor_tenant, the bare id: here one that holds an @"
    assert found(None, "acme") == ["a", "e", "f"]
    assert found("alice@initech") == []
    assert found("tenant-admin@acme-1a2b3c") == ["old-8"], "an old id with an @ still finds its events"
    assert found("spiffe://td/tenant/acme/group/web/w1@acme") == ["f"]
    assert found("alice@not a slug") == []
    with sqlite_db.read_session() as s, pytest.raises(InvalidAuditEvent, match="slug"):
        list_events(s, actor_tenant="Not_A_Slug")


@pytest.mark.parametrize("actor, problem", [
    (Actor("alice", "tenant"), "names its tenant"),
    (Actor("spiffe://td/tenant/acme/group/web/w1", "workload"), "names its tenant"),
    (Actor("alice", "tenant", "Acme Corp"), "names its tenant"),
    (Actor("root", "admin", "acme"), "belongs to no tenant"),
    (Actor("node:gpu1", "node", "acme"), "belongs to no tenant"),
    (Actor("sweeper", "system", "acme"), "belongs to no tenant"),
])
def test_an_actor_is_refused_without_its_tenant_or_with_one_it_cannot_have(sqlite_db: Database, actor: Actor,
                                                                           problem: str) -> None:
    with sqlite_db.session() as s, pytest.raises(InvalidAuditEvent, match=problem):
        record(s, actor=actor, action="thing.touch", object_type="thing", object_id="x")
    with sqlite_db.read_session() as s:
        assert list_events(s) == []


def _export(db: Database, signer: KeySigner, fmt: str) -> bytes:
    buf = io.BytesIO()
    export_events(db, signer, buf, fmt=fmt, origin=ORIGIN)
    return buf.getvalue()


@pytest.fixture
def two_alices(sqlite_db: Database) -> Database:
    with sqlite_db.session() as s:
        record(s, actor=Actor("alice", "tenant", "acme"), action="grant.request", object_type="grant",
               object_id="g-1", tenant="acme")
        record(s, actor=Actor("alice", "tenant", "globex"), action="grant.approve", object_type="grant",
               object_id="g-1", tenant="acme")
        record(s, actor=Actor("ops", "admin"), action="tenant.update", object_type="tenant", object_id="acme",
               tenant="acme")
    return sqlite_db


def test_jsonl_carries_the_actor_tenant(two_alices: Database, signer: KeySigner) -> None:
    lines = [json.loads(line) for line in _export(two_alices, signer, "jsonl").splitlines()[1:]]
    assert [e["event"]["actor"] for e in lines] == [{"id": "alice", "kind": "tenant", "tenant": "acme"},
                                                     {"id": "alice", "kind": "tenant", "tenant": "globex"},
                                                     {"id": "ops", "kind": "admin"}]


def test_csv_appends_an_actor_tenant_column_that_cannot_be_changed(two_alices: Database, signer: KeySigner) -> None:
    data = _export(two_alices, signer, "csv")
    rows = list(csv.reader(io.StringIO(data.decode())))
    assert V3_COLUMNS[:-1] == V2_COLUMNS and V3_COLUMNS[-1] == "actor_tenant", "appended: earlier columns keep places"
    assert tuple(rows[0]) == CSV_COLUMNS == (*V3_COLUMNS, "formula_guard"), "and so after it"
    events = [dict(zip(rows[0], r, strict=True)) for r in rows if r[0] == "event"]
    assert [(e["actor_id"], e["actor_tenant"]) for e in events] == [("alice", "acme"), ("alice", "globex"),
                                                                    ("ops", "")]
    verify_export(io.BytesIO(data), signer.public_key(), fast=False)
    at = [i for i, r in enumerate(rows) if r[0] == "event"]
    for row, tenant in ((at[0], "globex"), (at[1], ""), (at[2], "acme")):  # moved, dropped, made up
        forged = [list(r) for r in rows]
        forged[row][len(V3_COLUMNS) - 1] = tenant
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(forged)
        for fast in (True, False):
            with pytest.raises(Modified):
                verify_export(io.BytesIO(out.getvalue().encode()), signer.public_key(), fast=fast)


def test_ocsf_maps_the_actor_tenant_to_the_users_org(two_alices: Database, signer: KeySigner) -> None:
    data = _export(two_alices, signer, "ocsf")
    events = [json.loads(line) for line in data.splitlines()[1:]]
    users = [e["actor"]["user"] for e in events]
    assert [(u["uid"], u["name"], u.get("org")) for u in users] == [
        ("alice@acme", "alice", {"uid": "acme", "name": "acme"}),
        ("alice@globex", "alice", {"uid": "globex", "name": "globex"}),
        ("ops", "ops", None),
    ]
    assert [u["account"]["uid"] for u in users] == ["alice@acme", "alice@globex", "ops"]
    assert events[1]["metadata"]["tenant_uid"] == "acme", "the event's tenant stays whose object it is"
    parsed = User.model_validate(users[1])
    assert parsed.org is not None and parsed.org.uid == "globex"
    verify_export(io.BytesIO(data), signer.public_key(), fast=False)
    forged = data.replace(b'"org":{"name":"globex","uid":"globex"}', b'"org":{"name":"acme","uid":"acme"}')
    assert forged != data
    with pytest.raises(Modified, match="OCSF"):
        verify_export(io.BytesIO(forged), signer.public_key(), fast=False)


def test_a_group_commit_writes_the_actor_tenant(db: Database, signer: KeySigner) -> None:
    """A group commit's members (store/deferred.py) get their events before they are numbered, and the batch writes
    them together (on PostgreSQL as one JSON array): the tenant goes all the way in both."""
    from store import deferred

    with db.session() as s:
        deferred.begin(s)
        deferred.batch(s)
        queued = [record(s, actor=Actor("alice", "tenant", tenant), action="thing.touch", object_type="thing",
                         object_id=tenant, tenant="acme") for tenant in ("acme", "globex")]
        queued.append(record(s, actor=Actor("ops", "admin"), action="thing.touch", object_type="thing",
                             object_id="ops"))
        assert [(e.seq, e.actor_tenant) for e in queued] == [(-1, "acme"), (-1, "globex"), (-1, None)]
        deferred.finish(s)
        deferred.flush(s)
    with db.read_session() as s:
        rows = list_events(s)
    assert [(r.seq, r.actor_tenant) for r in rows] == [(0, "acme"), (1, "globex"), (2, None)]
    assert [json.loads(r.data)["actor"] for r in rows] == [event_document(r)["actor"] for r in rows]
    assert verify_export(io.BytesIO(_export(db, signer, "jsonl")), signer.public_key(), fast=False).events == 3


def test_old_events_rebuild_to_their_bytes_from_the_columns() -> None:
    """event_document on the columns of an old event, as its row holds them after step 15 (actor_tenant NULL),
    gives its exact bytes (no `tenant` key in its actor, not a null one)."""
    for data in _old_events():
        doc: dict[str, Any] = json.loads(data)
        row = AuditEvent(seq=doc["seq"], ts=datetime.fromisoformat(doc["ts"].replace("Z", "+00:00")),
                         actor_id=doc["actor"]["id"], actor_kind=doc["actor"]["kind"], tenant=doc["tenant"],
                         action=doc["action"], object_type=doc["object"]["type"], object_id=doc["object"]["id"],
                         summary=doc["summary"], reason=doc["reason"], request_id=doc["request_id"],
                         prev_hash=doc["prev_hash"], leaf_hash="", data=data.decode())
        assert row.actor_tenant is None
        assert canonical_json(event_document(row)) == data
