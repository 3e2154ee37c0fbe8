"""Engine, sessions and schema migrations; no business logic lives here."""

from store.db import Database, make_engine, sqlite_url

__all__ = ["Database", "make_engine", "sqlite_url"]
