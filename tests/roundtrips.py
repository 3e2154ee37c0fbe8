"""What the database is sent, counted where the driver sends it: libpq's own trace of the wire protocol on
PostgreSQL (a round trip is a simple Query or an extended-protocol Sync: what the server answers), sqlite3's trace
callback on SQLite (every statement it runs). A Parse synced without a Bind (psycopg preparing a
statement it ran five times, once per connection) is not counted: the figures are the steady state's.
SQLAlchemy's cursor events would miss the statements the code sends
through a driver cursor (the audit append), and BEGIN, COMMIT and ROLLBACK, which the driver issues itself."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

_MESSAGE = re.compile(r'^F\t\d+\t(Query|Parse|Bind|Sync)\t?(.*)$')


_ROUND = "#round"
_LITERAL = re.compile(r"x?'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def _shape(sql: str) -> str:
    return _LITERAL.sub("?", sql)


class Sent:
    """The statements (SQL text, first 160 characters) the engine's connections sent while `watch` was open, in
    rounds (`next_round`)."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = [[]]
        self._lock = threading.Lock()
        self._trace: Any = None
        self._last_shape = ""

    def next_round(self) -> None:
        """What is sent from now on is the next round's (a connection's first statements are missed until it
        was checked out once: libpq's trace starts after the pool's checkout)."""
        if self._trace is not None:
            os.write(self._trace.fileno(), f"{_ROUND}\n".encode())
        else:
            self._new_round()

    def _new_round(self) -> None:
        with self._lock:
            self.rounds.append([])

    def add(self, sql: str, *, again: bool = True) -> None:
        """`again=False`: the same statement (its values aside) just after itself is one call (an executemany's
        rows, or a trigger's run, which sqlite3 reports as its statement again)."""
        shape = _shape(sql)
        with self._lock:
            last = self.rounds[-1]
            if again or not last or self._last_shape != shape:
                last.append(" ".join(sql.split())[:160])
            self._last_shape = shape


def listing(statements: list[str]) -> str:
    return "\n".join(f"{i + 1:3d}. {s}" for i, s in enumerate(statements))


@contextmanager
def watch(engine: Engine) -> Iterator[Sent]:
    """Count what every connection of `engine` checked out from now on sends, until the block ends."""
    sent = Sent()
    pg = engine.dialect.name == "postgresql"
    with tempfile.TemporaryFile("w+") as trace:
        if pg:
            sent._trace = trace
        traced: list[Any] = []
        on = [True]

        def checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
            if not on[0] or any(c is dbapi_conn for c in traced):
                return
            traced.append(dbapi_conn)
            if pg:
                from psycopg import pq

                dbapi_conn.pgconn.trace(trace.fileno())
                dbapi_conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            else:
                def on_sql(sql: str) -> None:
                    if on[0]:
                        sent.add(sql, again=False)

                dbapi_conn.set_trace_callback(on_sql)

        event.listen(engine.pool, "checkout", checkout)
        try:
            yield sent
        finally:
            on[0] = False
            event.remove(engine.pool, "checkout", checkout)
            for conn in traced:
                if pg:
                    if not conn.closed:
                        conn.pgconn.untrace()
                else:
                    conn.set_trace_callback(None)
            if pg:
                trace.flush()
                os.fsync(trace.fileno())
                trace.seek(0)
                parsed, bound = "", False
                for line in trace:
                    if line.startswith(_ROUND):
                        sent._new_round()
                        continue
                    m = _MESSAGE.match(line.rstrip("\n"))
                    if m is None:
                        continue
                    kind, text = m.groups()
                    if kind == "Parse":  # the statement of the Sync that follows
                        parsed = text.split('" "', 1)[-1].rsplit('"', 1)[0]
                    elif kind == "Bind":
                        bound = True
                    elif kind == "Query":
                        sent.add(text.strip().strip('"'))
                    elif bound:  # a statement run (a Parse alone: psycopg preparing one, once per connection)
                        sent.add(parsed or "(a prepared statement)")
                        parsed, bound = "", False
