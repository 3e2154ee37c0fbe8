"""The store on both real backends: migrations are versioned and idempotent; writes are atomic."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import inspect
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
