"""The read-only path of the CLI's read-only local commands: the embedded SQLite database through sqlite3
(store/readonly.py), only when it holds exactly the schema this code migrates to. Anything else (PostgreSQL,
another schema, no database) answers None and the command takes the full path (workflows/context.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from store.readonly import open_readonly

if TYPE_CHECKING:
    from store.readonly import ReadOnlyDb
    from workflows.settings import Settings

# The last of workflows.schema.STEPS (importing that loads SQLAlchemy; tests/cli/test_read_path.py checks
# they agree, so a new migration cannot leave this behind).
SCHEMA_VERSION = 20


def open_read_only(settings: Settings) -> ReadOnlyDb | None:
    """The data directory's database for reading, or None: take the full path."""
    if settings.database_url is not None:
        return None
    return open_readonly(settings.home, SCHEMA_VERSION)
