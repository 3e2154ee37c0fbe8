"""The store on both real backends: migrations are versioned and idempotent; writes are atomic."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect
from sqlmodel import select

from audit import Actor, record
from audit.models import AuditEvent
from store.db import Database
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
