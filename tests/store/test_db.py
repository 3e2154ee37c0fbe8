"""The store on both real backends: migrations are versioned and idempotent; writes are atomic."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import Connection, QueuePool, inspect, text
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


def _backend(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _checked_out(db: Database) -> int:
    """How many of the pool's connections are in use (PostgreSQL's engine has a QueuePool)."""
    pool = db.engine.pool
    assert isinstance(pool, QueuePool), pool
    return pool.checkedout()


def _transaction_status(conn: Connection) -> int:
    """The transaction status of the psycopg connection under `conn` (0: IDLE, no transaction open)."""
    driver = conn.connection.driver_connection
    assert driver is not None
    return int(driver.info.transaction_status)


@pytest.mark.postgres
def test_one_connection_serves_a_threads_reads_and_gives_it_back(postgres_db: Database) -> None:
    """Inside `one_connection` a thread's reads outside a transaction (a request's token row, then its marker) share
    one pooled connection, still each statement alone (autocommit: no transaction left open on it); a write
    transaction gives it back first, and the block's end returns it to the pool."""
    db = postgres_db
    with db.statement() as conn:
        _backend(conn)  # the pool holds a connection now; outside the block every read checks one out
    with db.one_connection():
        assert _checked_out(db) == 0  # taken at the first read, not before
        with db.statement() as conn:
            first = _backend(conn)
        assert _checked_out(db) == 1
        with db.statement() as conn:
            assert _backend(conn) == first
        with db.read_session(statements=True) as s:
            assert _backend(s.connection()) == first
            assert _transaction_status(s.connection()) == 0  # IDLE: autocommit
        with db.one_connection(), db.statement() as conn:  # nested: the same one
            assert _backend(conn) == first
        with db.session() as s:  # a write: the held one went back to the pool first (the write takes its own)
            assert _checked_out(db) == 0
            record(s, actor=Actor.system("t"), action="test.write", object_type="t", object_id="1")
        assert _checked_out(db) == 0
        with db.statement() as conn:  # taken again
            assert int(conn.execute(text("SELECT count(*) FROM audit_events")).scalar_one()) == 1
        assert _checked_out(db) == 1
    assert _checked_out(db) == 0


@pytest.mark.postgres
def test_a_write_inside_an_open_read_leaves_that_read_its_connection(postgres_db: Database) -> None:
    """A write transaction (or a wait in the group committer) gives the shared connection back, but not while a read
    of the same thread still uses it: closing it would fail that read's next statement."""
    db = postgres_db
    with db.one_connection():
        with db.statement() as conn:
            first = _backend(conn)
            with db.session() as s:
                record(s, actor=Actor.system("t"), action="test.write", object_type="t", object_id="1")
            assert _backend(conn) == first  # still open, still the same
            with db.read_session(statements=True) as rs:
                db.give_back()
                assert _backend(rs.connection()) == first
        assert _checked_out(db) == 1  # the read block ended: kept for the request's next read
        db.give_back()
        assert _checked_out(db) == 0


@pytest.mark.postgres
def test_a_snapshot_build_leaves_a_shared_connection_without_a_transaction(postgres_db: Database) -> None:
    """The grant decider builds a document in a REPEATABLE READ transaction of its own beside a request's read session
    (policy/grant_decider.py _snapshot_build): on the connection `one_connection` shares, that transaction (and its
    snapshot) would outlive the build, and every later read of the request would see that snapshot."""
    from datetime import UTC, datetime

    from policy.grant_decider import _snapshot_build

    db = postgres_db
    with db.one_connection():
        with db.read_session(statements=True) as s:
            _snapshot_build(s, datetime.now(UTC))
        with db.statement() as conn:
            conn.execute(text("SELECT 1"))
            assert _transaction_status(conn) == 0  # IDLE, not INTRANS
