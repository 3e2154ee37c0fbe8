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


def current_version(engine: Engine) -> int:
    with engine.connect() as conn:
        _meta.create_all(conn)
        row = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version.desc())).first()
        conn.commit()
    return int(row[0]) if row else 0


def migrate(engine: Engine, steps: Sequence[Migration]) -> list[int]:
    """Apply the steps not yet applied, each in its own transaction; returns the versions applied."""
    versions = [step.version for step in steps]
    if versions != sorted(set(versions)):
        raise ValueError(f"schema steps must have distinct, increasing versions, got {versions}")
    applied: list[int] = []
    done = current_version(engine)
    for step in steps:
        if step.version <= done:
            continue
        with engine.begin() as conn:
            step.apply(conn)
            conn.execute(
                schema_version.insert().values(
                    version=step.version, description=step.description, applied_at=datetime.now(UTC)
                )
            )
        applied.append(step.version)
    return applied
