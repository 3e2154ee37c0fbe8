"""store.db.driver_rows: a statement sent on the driver's cursor fails as any SQLAlchemy statement does (a wrapped
error carrying the driver's, a lost connection an invalidating OperationalError), so a request still answers
503 with a reason and the group committer still recognises a deadlock; and its rows are the driver's tuples."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from store.db import Database, driver_rows, pg_array


def _param(db: Database) -> str:
    return "%(n)s" if db.dialect == "postgresql" else ":n"


def test_rows_are_the_drivers_tuples(db: Database) -> None:
    with db.statement() as conn:
        assert driver_rows(conn, f"SELECT {_param(db)} + 1, 'x'", {"n": 41}) == [(42, "x")]


def test_a_bad_statement_is_sqlalchemys_error_with_the_drivers_inside(db: Database) -> None:
    error = ProgrammingError if db.dialect == "postgresql" else OperationalError
    with db.statement() as conn, pytest.raises(error) as e:
        driver_rows(conn, "SELECT * FROM no_such_table", {})
    assert "no_such_table" in str(e.value.orig)
    if db.dialect == "postgresql":
        assert e.value.orig.sqlstate == "42P01"  # type: ignore[union-attr]  # what groupcommit.transient reads
    with db.statement() as conn:  # the connection is still usable
        assert driver_rows(conn, f"SELECT {_param(db)}", {"n": 1}) == [(1,)]


@pytest.mark.postgres
def test_a_lost_connection_is_an_invalidating_operational_error(postgres_db: Database) -> None:
    db = postgres_db
    with db.statement() as conn:
        pid = driver_rows(conn, "SELECT pg_backend_pid()", {})[0][0]
        with db.statement() as other:
            other.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid})  # waits until it is gone
        with pytest.raises(OperationalError) as e:
            driver_rows(conn, "SELECT 1", {})
        assert e.value.connection_invalidated
    with db.statement() as conn:  # the pool hands out a fresh connection: no restart needed
        assert driver_rows(conn, "SELECT 1", {}) == [(1,)]


@pytest.mark.postgres
def test_a_driver_write_is_announced_at_its_commit_as_sqlalchemys_are(postgres_db: Database) -> None:
    import psycopg

    from store.changes import CHANNEL
    from store.db import driver_write

    db = postgres_db
    dsn = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with db.session() as session:  # its only statement is the driver's
            driver_write(session.connection(), "INSERT INTO audit_counters (key, count, last_leaf) "
                         "VALUES (%(k)s, 1, '')", {"k": "test:driver-write"})
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in heard] == [CHANNEL]  # without the announcement the COMMIT sends no NOTIFY


@pytest.mark.postgres
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12),
                      max_size=5),
       numbers=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
       blobs=st.lists(st.binary(max_size=40), max_size=5))
@example(texts=["NULL", "", " a b ", '"', "\\", "{x,y}", "\\x00"], numbers=[-(2**63), 0], blobs=[b"", b"\x00\\"])
def test_an_array_literal_comes_back_as_the_list_it_was_made_of(postgres_db: Database, texts: list[str],
                                                              numbers: list[int], blobs: list[bytes]) -> None:
    """pg_array (the audit append's arrays, sent as one string each instead of psycopg's list adaptation): any text
    (quotes, backslashes, braces, commas, blanks, the word NULL), any bigint, any bytes."""
    with postgres_db.statement() as conn:
        row = driver_rows(conn, "SELECT %s::text[], %s::bigint[], %s::bytea[]",
                          [pg_array(texts), pg_array(numbers), pg_array(blobs)])[0]
    assert (row[0], row[1], [bytes(b) for b in row[2]]) == (texts, numbers, blobs)


def test_an_array_literal_refuses_what_it_cannot_spell() -> None:
    for bad in ([1.5], [None], [True]):
        with pytest.raises(TypeError):
            pg_array(bad)  # type: ignore[arg-type]
