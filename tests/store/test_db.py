"""The store on both real backends: migrations are versioned and idempotent; writes are atomic."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlmodel import select

from audit import Actor, record
from audit.models import AuditEvent
from store.db import Database, sqlite_url
from store.migrations import current_version
from workflows.schema import STEPS as MIGRATIONS
from workflows.schema import migrate


def test_migrations_apply_once_and_record_version(db: Database) -> None:
    assert current_version(db.engine) == MIGRATIONS[-1].version
    assert migrate(db.engine) == []  # second run applies nothing
    tables = set(inspect(db.engine).get_table_names())
    assert {"schema_version", "audit_events", "tenants", "workloads"} <= tables


def test_failed_transaction_leaves_nothing(db: Database) -> None:
    with pytest.raises(RuntimeError), db.session() as s:
        record(s, actor=Actor.system(), action="test.fail", object_type="t", object_id="1")
        raise RuntimeError("boom")
    with db.read_session() as s:
        assert s.exec(select(AuditEvent)).all() == []


def test_committed_transaction_is_visible(db: Database) -> None:
    with db.session() as s:
        record(s, actor=Actor.system(), action="test.ok", object_type="t", object_id="1")
    with db.read_session() as s:
        rows = s.exec(select(AuditEvent)).all()
    assert [r.action for r in rows] == ["test.ok"]
    assert rows[0].ts.tzinfo is not None or db.dialect == "sqlite"


def test_sqlite_files_are_private(tmp_path: Path) -> None:
    """Should fix: the database file (and its -wal and -shm files) was created 0644 under the usual umask,
    readable by every local user (grants, token hashes, the whole audit log), on the code before the fix."""
    old = os.umask(0o022)
    try:
        db = Database(sqlite_url(tmp_path))
        migrate(db.engine)
        with db.session() as s:  # a write, so the WAL and shared-memory files exist
            record(s, actor=Actor.system(), action="test.ok", object_type="t", object_id="1")
        files = sorted(tmp_path.glob("trustfabric.db*"))
        assert [f.name for f in files] == ["trustfabric.db", "trustfabric.db-shm", "trustfabric.db-wal"]
        assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o600 for f in files}
        db.dispose()
        loose = tmp_path / "loose"
        loose.mkdir()
        (loose / "trustfabric.db").touch(mode=0o644)  # a database made before the fix is tightened on open
        Database(sqlite_url(loose)).dispose()
        assert stat.S_IMODE((loose / "trustfabric.db").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_one_statement_reads_send_no_transaction_and_see_every_commit(db: Database) -> None:
    """`statement()` (and read_session(statements=True) on PostgreSQL) sends the statement alone: no BEGIN, no
    ROLLBACK, no ping (issue 11: a round trip each); each statement reads what is committed when it runs."""
    from tests.roundtrips import watch

    def events() -> int:
        with db.statement() as conn:
            return int(conn.execute(text("SELECT count(*) FROM audit_events")).scalar_one())

    counts = []
    with watch(db.engine) as sent:
        for _ in range(4):  # rounds of a read, then a write; the first ones warm the pool's traced connections
            sent.next_round()
            counts.append(events())
            sent.next_round()
            with db.session() as s:
                record(s, actor=Actor.system("t"), action="test.write", object_type="t", object_id="1")
    assert counts == list(range(counts[0], counts[0] + 4))
    reads = sent.rounds[1::2][2:]
    assert reads == [["SELECT count(*) FROM audit_events"]] * len(reads) and reads


@pytest.mark.postgres
def test_a_statements_read_session_is_never_taken_for_one_snapshot(postgres_db: Database) -> None:
    """The grant decider keeps a data document only when it was read in one snapshot (policy/grant_decider.py):
    a session without a transaction is not one, whatever the server's default isolation level says."""
    from policy.grant_decider import _one_snapshot

    with postgres_db.engine.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{postgres_db.engine.url.database}" '
                          "SET default_transaction_isolation = 'repeatable read'"))
        conn.commit()
    postgres_db.engine.dispose()  # new connections take the new default
    with postgres_db.read_session(statements=True) as s:
        assert not _one_snapshot(s)
    with postgres_db.read_session(snapshot=True) as s:
        assert _one_snapshot(s)
