"""One SQLModel layer over two real databases: SQLite (default, WAL) and PostgreSQL (psycopg 3).

Every write transaction on SQLite starts with BEGIN IMMEDIATE, so the writer lock is taken up front
and the audit log head cannot be read stale by two writers (a deferred transaction that upgrades
later fails with SQLITE_BUSY instead of waiting). Read-only sessions use `read_session()`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

_WRITE_OPTION = "tf_write"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'trustfabric.db'}"


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine with the per-backend settings this project relies on."""
    if url.startswith("sqlite"):
        private_sqlite_files(url)
        engine = create_engine(
            url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}
        )
        _configure_sqlite(engine)
        return engine
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return create_engine(url, echo=echo, pool_pre_ping=True)


def private_sqlite_files(url: str) -> None:
    """The database file (and its WAL and shared-memory files) readable by the owner only, mode 0600: made
    empty with that mode before SQLite opens it (SQLite gives the -wal and -shm files the database file's
    mode), and an existing file's mode tightened. In-memory databases have no file."""
    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    if not os.path.exists(path):
        with contextlib.suppress(OSError):  # a missing directory and the like: SQLite reports it on connect
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for name in (path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get(_WRITE_OPTION, True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class Database:
    """The engine plus session factories; one per process, shared by services and the API."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine = make_engine(url, echo=echo)
        self._reader = self.engine.execution_options(**{_WRITE_OPTION: False})

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A write transaction: committed on success, rolled back whole on any exception."""
        with Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A read-only snapshot; never committed."""
        # Closing (not rolling back) ends the transaction and keeps loaded objects readable.
        with Session(self._reader, expire_on_commit=False) as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
