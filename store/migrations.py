"""Runs versioned schema steps and keeps the version table; owns no step itself.

The rule for steps: each domain owns its own (`<domain>/migrations.py`), each holding the DDL it ran when
it landed, written out as its own tables (never derived from the models, which grow), so a database
migrated a year ago and one migrated today have the same history. A schema change is a new step with the
next free version; a landed step never changes (tests/store/test_migrations.py checks that the steps'
result matches the models and pins each landed step). The composition root hands the whole ordered list
to `migrate` (workflows/schema.py), so this lowest layer imports no domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Column as SAColumn
from sqlalchemy import Connection, DateTime, Integer, MetaData, String, Table, select
from sqlalchemy.engine import Engine

_meta = MetaData()
schema_version = Table(
    "schema_version",
    _meta,
    SAColumn("version", Integer, primary_key=True),
    SAColumn("description", String(200), nullable=False),
    SAColumn("applied_at", DateTime(timezone=True), nullable=False),
)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


# One PostgreSQL advisory lock for schema changes ('tfmi'): replicas starting together take turns.
_MIGRATION_LOCK = 0x74666D69


def _take_turn(conn: Connection) -> None:
    """Hold the schema's lock until this transaction ends. SQLite needs nothing more: the transaction began with
    BEGIN IMMEDIATE (store/db.py), the database's one writer lock."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")


def _version(conn: Connection) -> int:
    row = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version.desc())).first()
    return int(row[0]) if row else 0


def current_version(engine: Engine) -> int:
    with engine.begin() as conn:
        _take_turn(conn)
        _meta.create_all(conn)
        return _version(conn)


def migrate(engine: Engine, steps: Sequence[Migration]) -> list[int]:
    """Apply the steps not yet applied, each in its own transaction; returns the versions applied. Several
    processes may run it at once on one database (replicas started together): each step is applied by the
    first to take its turn, and the others find it applied."""
    versions = [step.version for step in steps]
    if versions != sorted(set(versions)):
        raise ValueError(f"schema steps must have distinct, increasing versions, got {versions}")
    applied: list[int] = []
    done = current_version(engine)
    for step in steps:
        if step.version <= done:
            continue
        with engine.begin() as conn:
            _take_turn(conn)
            if _version(conn) >= step.version:
                continue  # another process applied it while this one waited
            step.apply(conn)
            conn.execute(
                schema_version.insert().values(
                    version=step.version, description=step.description, applied_at=datetime.now(UTC)
                )
            )
        applied.append(step.version)
    return applied
