"""The PostgreSQL change feed (store/changes.py): a commit anywhere moves every process's counter, at once
through the NOTIFY every write transaction sends, and within the poll when no notification comes (a writer
that never sends one, a lost notification); a rolled-back transaction moves nothing for good."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlmodel import text

from store.changes import PostgresChanges
from store.db import Database

pytestmark = pytest.mark.postgres


def _plain(db: Database) -> str:
    return db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def _moved_within(feed: PostgresChanges, before: int | None, timeout: float = 5.0) -> float:
    start = time.perf_counter()
    while feed.version() == before:
        assert time.perf_counter() - start < timeout, "the counter never moved"
        time.sleep(0.001)
    return time.perf_counter() - start


def test_a_commit_moves_the_counter_with_or_without_a_notification(postgres_db: Database) -> None:
    with postgres_db.session() as s:
        s.exec(text("CREATE TABLE feed_probe (x int)"))  # type: ignore[call-overload]
    feed = PostgresChanges(_plain(postgres_db), poll=0.05)
    try:
        deadline = time.monotonic() + 10
        while feed.version() is None:  # unknown until the first read: nothing may be trusted meanwhile
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = feed.version()
        with postgres_db.session() as s:  # the project's writes announce themselves
            s.exec(text("INSERT INTO feed_probe VALUES (1)"))  # type: ignore[call-overload]
        _moved_within(feed, before)
        deadline = time.monotonic() + 5
        while feed.notifications == 0:
            assert time.monotonic() < deadline, "the NOTIFY sent at commit never arrived"
            time.sleep(0.01)
        before = feed.version()
        with psycopg.connect(_plain(postgres_db), autocommit=True) as conn:  # a writer that never notifies
            conn.execute("INSERT INTO feed_probe VALUES (2)")
        assert _moved_within(feed, before) < 1.0  # the poll (50 ms) finds the snapshot changed
    finally:
        feed.stop()
    assert feed._thread is not None and not feed._thread.is_alive()


def test_the_feed_stops_with_the_database(postgres_db: Database) -> None:
    deadline = time.monotonic() + 10
    while postgres_db.change_version() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    feed = postgres_db._changes
    assert feed is not None
    postgres_db.dispose()
    assert feed._thread is not None and not feed._thread.is_alive()


def test_a_notification_moves_the_counter_as_it_arrives_without_waiting_for_the_poll(postgres_db: Database) -> None:
    """With a poll far longer than the bound, only the notification can move the counter in time: it does so as
    it arrives (psycopg's notifies() runs until its timeout, so counting them after it returns waited the poll)."""
    feed = PostgresChanges(_plain(postgres_db), poll=1.0)
    try:
        deadline = time.monotonic() + 10
        while feed.version() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(3):
            before = feed.version()
            with postgres_db.session() as s:
                s.exec(text("SELECT 1"))  # type: ignore[call-overload]
                s.connection().exec_driver_sql("NOTIFY trustfabric_changes")
            assert _moved_within(feed, before, timeout=1.5) < 0.2
    finally:
        feed.stop()
