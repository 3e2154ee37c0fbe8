"""One SQLModel layer over two real databases: SQLite (default, WAL) and PostgreSQL (psycopg 3).

Every write transaction on SQLite starts with BEGIN IMMEDIATE, so the writer lock is taken up front
and the audit log head cannot be read stale by two writers (a deferred transaction that upgrades
later fails with SQLITE_BUSY instead of waiting). Read-only sessions use `read_session()`; a read that is one
statement uses `statement()` (no transaction: on PostgreSQL no BEGIN and no ROLLBACK, two round trips fewer).

Round trips are what a request pays most for beside its own work (issue 11: each costs the database ~50 us of
CPU and this process more in SQLAlchemy and the driver), so: no ping before each checkout (`pool_pre_ping`, one
round trip per transaction). A connection the server dropped (a PostgreSQL restart) fails on its first use
instead, as an OperationalError that SQLAlchemy recognises as a disconnect: it invalidates every pooled
connection opened before then, the request answers 503 with the reason (api/errors.py), and the next request
gets a fresh connection; a transaction already under way when the server goes fails the same way either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from psycopg.pq import ExecStatus
from sqlalchemy import JSON, Table, event, make_url
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlmodel import Session, create_engine

from store.carried import settle_pending
from store.changes import CHANNEL, PostgresChanges
from store.readonly import DB_FILE

_TUPLES_OK = ExecStatus.TUPLES_OK
_WRITE_OPTION = "tf_write"
_STATEMENT_OPTION = "tf_statement"  # `Database.statement()`: no transaction around a statement


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / DB_FILE}"


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
    # kept connections for a server process's worker threads (16, api/workers.py), its group committer and its
    # background jobs: beyond pool_size, a connection is opened for the burst and closed at once when returned
    # (a PostgreSQL backend started and ended each time); the same 30 at most, as before
    engine = create_engine(url, echo=echo, pool_size=20, max_overflow=10, pool_timeout=10)
    _announce_commits(engine)
    return engine


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
        options = conn.get_execution_options()
        if options.get(_STATEMENT_OPTION):
            return  # each statement its own (implicit) transaction: pysqlite's isolation_level is None
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(_WRITE_OPTION, True) else "BEGIN")


_WROTE = "tf_wrote"
_NOTIFIED = "tf_notified"
_this_thread = threading.local()  # .wrote: a statement of this thread wrote since its session began
_WRITES = ("insert", "update", "delete")


def notified(conn: Any) -> None:
    """The transaction of `conn` (a SQLAlchemy Connection) sent `NOTIFY trustfabric_changes` itself (the audit
    append folds `pg_notify` into its statement): its COMMIT need not send another (a round trip). PostgreSQL
    delivers a transaction's notifications at its commit, wherever in it they were sent."""
    conn.info[_NOTIFIED] = True


def _announce_commits(engine: Engine) -> None:
    """Every PostgreSQL transaction that wrote sends `NOTIFY trustfabric_changes` before its COMMIT (just before,
    unless a statement of it did, `notified`), delivered to listeners (store/changes.py, on every replica) when
    it commits and never if it rolls back."""
    @event.listens_for(engine, "after_cursor_execute")
    def _note_write(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip()[:6].lower() in _WRITES:
            conn.info[_WROTE] = True
            _this_thread.wrote = True

    @event.listens_for(engine, "commit")
    def _before_commit(conn: Any) -> None:
        wrote, sent = conn.info.pop(_WROTE, False), conn.info.pop(_NOTIFIED, False)
        if wrote and not sent:
            # through SQLAlchemy, so a lost connection is its OperationalError (503), like any statement's
            conn.exec_driver_sql(f"NOTIFY {CHANNEL}")

    @event.listens_for(engine, "rollback_savepoint")
    def _unsent(conn: Any, _name: Any, _context: Any) -> None:
        conn.info.pop(_NOTIFIED, None)  # it may have been sent inside the savepoint: its notification is gone

    @event.listens_for(engine, "rollback")
    def _forget(conn: Any) -> None:
        if not conn.invalidated:  # a lost connection has nothing to forget (a stale flag costs one NOTIFY)
            conn.info.pop(_WROTE, None)
            conn.info.pop(_NOTIFIED, None)


def driver_rows(conn: Connection, sql: str, params: Any) -> list[tuple[Any, ...]]:
    """The rows of one statement in the driver's own SQL (its paramstyle), sent on the driver's cursor: for the
    hot statements (a grant's head lock, a token's row, a decision's marker), where SQLAlchemy's per-statement
    work (execution context, result object, events) cost twice the driver's. A driver error goes through
    SQLAlchemy's own handling, as any statement's: wrapped (an OperationalError answers 503), and a lost
    connection invalidates the pool as SQLAlchemy would."""
    with _driver_cursor(conn, sql, params) as cursor:
        cursor.execute(sql, params)
        result = getattr(cursor, "pgresult", None)  # psycopg's: its status says whether rows came, where
        # `description` builds a Column object per column first
        if result is not None:
            return list(cursor.fetchall()) if result.status == _TUPLES_OK else []
        return list(cursor.fetchall()) if cursor.description is not None else []


def placeholder(conn: Connection) -> str:
    """A positional parameter's mark in the SQL of the connection's driver (sqlite3's `?`, psycopg's `%s`): for SQL
    sent through driver_rows that takes parameters on both databases."""
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def driver_write(conn: Connection, sql: str, params: Any) -> None:
    """driver_rows for a statement that writes, announced as SQLAlchemy's writes are (`_announce_commits`): its
    COMMIT notifies the change feeds, and this process's feed moves at once (Database.session)."""
    driver_rows(conn, sql, params)
    _wrote(conn)


def driver_write_many(conn: Connection, sql: str, params: list[Any]) -> None:
    """driver_write of one statement for each of `params`, as psycopg's executemany sends them: pipelined, one
    round trip for all (a group commit's rows queued by store/deferred.py)."""
    with _driver_cursor(conn, sql, params) as cursor:
        cursor.executemany(sql, params)
    _wrote(conn)


def driver_write_batches(conn: Connection, batches: list[tuple[str, list[Any]]], *,
                         lock_timeout_ms: int | None = None) -> None:
    """driver_write_many of several statements in one pipeline (one round trip). With `lock_timeout_ms` (PostgreSQL),
    they wait at most that long for a lock (`SET LOCAL lock_timeout` around them, put back after): for writes made
    while this transaction holds the audit head's lock, where waiting for another transaction can only be waiting
    for one that waits for that head, a deadlock PostgreSQL would break only after deadlock_timeout (1 s, every
    writer of every replica stalled behind the head meanwhile). They fail instead (lock_not_available), the
    transaction with them."""
    if not batches:
        return
    sql = batches[0][0]
    dbapi: Any = conn.connection.driver_connection
    with _driver_cursor(conn, sql, batches[0][1]) as cursor, dbapi.pipeline():
        if lock_timeout_ms is not None:
            cursor.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
        for statement, params in batches:
            cursor.executemany(statement, params)
        if lock_timeout_ms is not None:
            cursor.execute("SET LOCAL lock_timeout TO DEFAULT")
    _wrote(conn)


@contextmanager
def _driver_cursor(conn: Connection, sql: str, params: Any) -> Iterator[Any]:
    """A cursor of the connection's driver, closed after; an error in the block handled as SQLAlchemy handles a
    statement's (driver_rows says how)."""
    dbapi = conn.connection.driver_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    try:
        yield cursor
    except Exception as exc:
        conn._handle_dbapi_exception(exc, sql, params, cursor, None)
    finally:
        cursor.close()


def _wrote(conn: Connection) -> None:
    conn.info[_WROTE] = True
    _this_thread.wrote = True


def pg_array(values: Iterable[str | int | bytes]) -> str:
    """A PostgreSQL array literal (`{...}`) of text, integers or bytes (bytea's hex form), for a parameter the SQL
    casts to the array's type (`%s::text[]`): psycopg adapts a Python list in Python, element by element (~9 us
    of client CPU a list, ~45 us for an audit append's five), a string in C. Every text element is quoted, its
    backslashes and double quotes escaped, so any text comes back as it went."""
    parts: list[str] = []
    for value in values:
        if isinstance(value, bytes):
            parts.append(f'"\\\\x{value.hex()}"')
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(str(int(value)))
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            raise TypeError(f"pg_array takes text, integers or bytes, not {type(value).__name__}")
    return "{" + ",".join(parts) + "}"


class DriverInsert:
    """One table's INSERT in psycopg's SQL, and its parameters from an object's attributes bound as SQLAlchemy
    binds them (JSON columns as json.dumps text cast to json; datetimes, numbers and text as they are): for the
    hot writes, where SQLAlchemy's statement execution cost more than the driver's. `prefix` keeps two tables'
    parameters apart in one statement (a data-modifying CTE carrying one row into another INSERT)."""

    def __init__(self, table: Table, *, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
        columns = [c for c in table.columns if c.name not in skip]
        self._names = tuple(c.name for c in columns)
        self._json = frozenset(c.name for c in columns if isinstance(c.type, JSON))
        self._prefix = prefix
        casts = {name: "::json" if name in self._json else "" for name in self._names}
        self.sql = (f"INSERT INTO {table.name} ({', '.join(self._names)}) "  # noqa: S608 (the table's own names)
                    f"VALUES ({', '.join(f'%({prefix}{n})s{casts[n]}' for n in self._names)})")

    def values(self, row: Any) -> dict[str, Any]:
        """The parameters of `row`: a mapped object, or a dict of its values by column name."""
        out: dict[str, Any] = {}
        loaded = row if isinstance(row, dict) else row.__dict__  # a mapped object's values, without the
        # instrumented attributes' descriptors
        for name in self._names:
            value = loaded[name] if name in loaded else getattr(row, name)
            out[self._prefix + name] = json.dumps(value) if name in self._json else value  # None: JSON null, as
            # SQLAlchemy's JSON type stores it
        return out



class _Held:
    """`Database.one_connection`'s slot: the shared connection (None until the first read, and after it was given
    back) and how many read blocks of the thread use it now."""

    __slots__ = ("conn", "users")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.users = 0

class Database:
    """The engine plus session factories; one per process, shared by services and the API."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine = make_engine(url, echo=echo)
        self._reader = self.engine.execution_options(**{_WRITE_OPTION: False})
        # on SQLite not isolation_level=AUTOCOMMIT: resetting it at check-in would run a PRAGMA and hand pysqlite
        # back its own implicit BEGINs; the connection is in autocommit already, only the BEGIN is skipped
        self._statements = self.engine.execution_options(**{_WRITE_OPTION: False, _STATEMENT_OPTION: True}, **(
            {} if self.dialect == "sqlite" else {"isolation_level": "AUTOCOMMIT"}))
        self._changes: PostgresChanges | None = None
        self._changes_lock = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A write transaction: committed on success, rolled back whole on any exception. The context's checks still
        to make (store/carried.py) are made first: nothing is written on one that was not."""
        settle_pending()
        self.give_back()  # a connection held for this thread's reads (`one_connection`) is not held through a write
        _this_thread.wrote = False
        held: dict[int, Session] = _this_thread.__dict__.setdefault("sessions", {})
        outer = held.get(id(self))
        with Session(self.engine, expire_on_commit=False) as session:
            held[id(self)] = session
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                if outer is None:
                    held.pop(id(self), None)
                else:
                    held[id(self)] = outer
        if self._changes is not None and getattr(_this_thread, "wrote", False):
            self._changes.bump()  # this process reads its own writes at once, not a notification later

    def open_session(self) -> Session | None:
        """The write session (`session`) this thread has open on this database, innermost first, else None. On SQLite
        a write transaction of its own would wait for this thread's own writer lock until busy_timeout: a write that
        must be committed by the time the open one commits (keys/shared.py publishing a key) joins it there."""
        held: dict[int, Session] = _this_thread.__dict__.get("sessions", {})
        return held.get(id(self))

    @contextmanager
    def read_session(self, *, snapshot: bool = False, statements: bool = False) -> Iterator[Session]:
        """A read-only transaction; never committed. `snapshot`: every statement in it reads one snapshot
        (REPEATABLE READ on PostgreSQL, whose default gives each statement its own; SQLite's read
        transaction is one already), for reads whose parts must agree (a cache key and the data under it).
        `statements`: on PostgreSQL no transaction at all (no BEGIN, no ROLLBACK: each statement its own
        snapshot, as in READ COMMITTED), for reads whose first statement reads what the rest must agree with
        (a grant decision's marker and data version, policy/grants.py); SQLite keeps its read transaction (one
        snapshot, which readers there may rely on, and its BEGIN is no round trip)."""
        # Closing (not rolling back) ends the transaction and keeps loaded objects readable.
        with ExitStack() as stack:
            bind: Engine | Connection = self._reader
            if statements and self.dialect == "postgresql":
                # no transaction: a held connection's reads are as a fresh one's
                bind = stack.enter_context(self._shared()) or self._statements
            with Session(bind, expire_on_commit=False) as session:
                if snapshot and self.dialect == "postgresql":
                    session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                yield session

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        """A connection for reads of one statement each, outside any transaction: each statement is its own
        snapshot (in PostgreSQL as in SQLite), and no BEGIN nor ROLLBACK is sent. For reads whose parts must
        agree, one statement reads them all; otherwise use `read_session`."""
        with self._shared() as held:
            if held is not None:
                yield held
                return
        with self._statements.connect() as conn:
            yield conn

    @contextmanager
    def one_connection(self) -> Iterator[None]:
        """PostgreSQL: this thread's reads outside any transaction in the block (`statement`, and
        `read_session(statements=True)`) share one pooled connection, taken at the first and given back when the
        block ends or the thread opens a write transaction (`session`, `give_back`; a later read takes one
        again). A request handed to a worker thread (api/handoff.py) reads its token's row and then its own first
        rows: one checkout and check-in (the pool's bookkeeping and the autocommit switch there and back, ~0.1 ms
        of CPU on a loaded replica) instead of one each. Each statement is still its own snapshot, as on a fresh
        connection: nothing is read inside a transaction on it. SQLite: nothing changes. Nested blocks share the
        outer one's connection."""
        if self.dialect != "postgresql":
            yield
            return
        scopes: dict[int, _Held] = _this_thread.__dict__.setdefault("one_connection", {})
        if id(self) in scopes:
            yield
            return
        scopes[id(self)] = _Held()
        try:
            yield
        finally:
            self.give_back()
            del scopes[id(self)]

    @contextmanager
    def _shared(self) -> Iterator[Connection | None]:
        """The connection `one_connection` holds for this thread (taken now if not yet), in use until the block
        ends; None outside one."""
        slot: _Held | None = _this_thread.__dict__.get("one_connection", {}).get(id(self))
        if slot is None:
            yield None
            return
        if slot.conn is None:
            slot.conn = self._statements.connect()
        slot.users += 1
        try:
            yield slot.conn
        finally:
            slot.users -= 1

    def give_back(self) -> None:
        """Return the connection `one_connection` holds for this thread to the pool now (the block goes on: a later
        read takes one again). For a thread about to wait or write: it holds no idle connection meanwhile. Not while
        a read of this thread still uses it (a `statement` or `read_session(statements=True)` block around the
        write): closing it would pull it from under that read; the block's end gives it back then."""
        slot: _Held | None = _this_thread.__dict__.get("one_connection", {}).get(id(self))
        if slot is not None and slot.conn is not None and slot.users == 0:
            conn, slot.conn = slot.conn, None
            conn.close()

    def change_version(self) -> int | None:
        """PostgreSQL: a counter that moves after every commit anywhere (store/changes.py; its thread starts
        on the first call and stops with dispose); None before it first read the database, and on SQLite."""
        if self.dialect != "postgresql":
            return None
        with self._changes_lock:
            if self._changes is None:
                self._changes = PostgresChanges(self.engine.url.set(drivername="postgresql").render_as_string(
                    hide_password=False))
                # a Database dropped without dispose() must not leave its feed polling for ever
                weakref.finalize(self, self._changes.halt)
        return self._changes.version()

    def dispose(self) -> None:
        with self._changes_lock:
            changes, self._changes = self._changes, None
        if changes is not None:
            changes.stop()
        self.engine.dispose()


def log_failure(log: logging.Logger, what: str, *args: object) -> None:
    """Log the exception being handled by a loop that retries (a background job, the reconciler): a database
    that is down or restarting as one warning line, as the API logs each request's 503, since a traceback per
    poll says nothing more; anything else as an error with its traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, OperationalError | InterfaceError):
        log.warning(what + ": the database is unavailable (%s)", *args, str(exc.orig or exc).splitlines()[0][:300])
    else:
        log.exception(what, *args)
