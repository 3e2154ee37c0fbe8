"""Versioned schema: an ordered list of steps and a version table.

A step, once landed, never changes: a later schema change is a new step. Steps create tables from
explicit model lists so a step's effect does not drift when a module grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Column as SAColumn
from sqlalchemy import Connection, DateTime, Integer, MetaData, String, Table, select
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

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


def create_tables(*models: type[SQLModel]) -> Callable[[Connection], None]:
    def _apply(conn: Connection) -> None:
        tables = [m.__table__ for m in models]  # type: ignore[attr-defined]
        SQLModel.metadata.create_all(conn, tables=tables)

    return _apply


def _inventory(conn: Connection) -> None:
    from inventory import models

    create_tables(*models.TABLES_V1)(conn)


def _pki(conn: Connection) -> None:
    from pki import models

    create_tables(*models.TABLES_V1)(conn)


def _audit(conn: Connection) -> None:
    from audit import models

    create_tables(*models.TABLES_V1)(conn)


def _policy(conn: Connection) -> None:
    from policy import models

    create_tables(*models.TABLES_V1)(conn)


def _api(conn: Connection) -> None:
    from pki.tokens import models

    create_tables(*models.TABLES_V1)(conn)


MIGRATIONS: Sequence[Migration] = (
    Migration(1, "audit log", _audit),
    Migration(2, "inventory: tenants, workload groups, workloads", _inventory),
    Migration(3, "pki: CAs, SVIDs, revocations, join tokens", _pki),
    Migration(4, "policy: grants, policy versions, decision log", _policy),
    Migration(5, "api: API tokens and principals", _api),
)


def current_version(engine: Engine) -> int:
    with engine.connect() as conn:
        _meta.create_all(conn)
        row = conn.execute(select(schema_version.c.version).order_by(schema_version.c.version.desc())).first()
        conn.commit()
    return int(row[0]) if row else 0


def migrate(engine: Engine, steps: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Apply the steps not yet applied, each in its own transaction; returns the versions applied."""
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
