"""Read-only queries of policy versions, as the one SQL text both paths run: the service through SQLAlchemy
(policy/service.py, any database) and the CLI's read-only path through sqlite3 (store/readonly.py), which
starts without SQLAlchemy. Plain SQL that SQLite and PostgreSQL both take."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from store.readonly import ReadOnlyDb, Record

TABLE = "policy_versions"  # policy.models.PolicyVersion.__tablename__ (tests/cli/test_read_path.py checks)
LIST_VERSIONS = f"SELECT * FROM {TABLE} ORDER BY number"  # noqa: S608 (a constant, no input)


def list_versions(db: ReadOnlyDb) -> list[Record]:
    """Every version, oldest first: the rows policy.service.list_versions maps to PolicyVersion."""
    return db.rows(LIST_VERSIONS, TABLE)
