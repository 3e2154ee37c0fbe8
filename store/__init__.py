"""Engine, sessions and schema migrations; no business logic lives here.

The names below load on first use (core/lazy.py): store/readonly.py serves the CLI's read-only commands
without SQLAlchemy, which importing store.db would load."""

from typing import TYPE_CHECKING

from core.lazy import lazy_exports

if TYPE_CHECKING:
    from store.db import Database, make_engine, sqlite_url

__all__ = ["Database", "make_engine", "sqlite_url"]

__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "store.db"))
