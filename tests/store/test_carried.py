"""Checks a later statement may carry (store/carried.py): one still pending is made before any write transaction
begins (Database.session, a group commit's submit) and when the carrying block ends, and one that refuses stops the
write before anything is written, on both databases."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session

from inventory.models import Tenant
from store import carried
from store.db import Database
from store.groupcommit import GroupCommitter

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Refused(Exception):
    pass


class Check:
    def __init__(self, admits: bool) -> None:
        self.admits, self.made = admits, 0
        self.settled_with: list[Any] = []
        self._done = self._failed = False

    @property
    def pending(self) -> bool:
        return not self._done and not self._failed

    def subquery(self) -> tuple[str, tuple[Any, ...]]:
        return "(SELECT %s)", (self.admits,)

    def settle(self, value: Any) -> None:
        self.settled_with.append(value)
        self.make()

    def make(self) -> None:
        self.made += 1
        if not self.admits:
            self._failed = True
            raise Refused("refused")
        self._done = True


def _tenant(slug: str) -> Tenant:
    return Tenant(slug=slug, display_name=slug, created_at=NOW)


def _exists(db: Database, slug: str) -> bool:
    with db.read_session() as s:
        return s.get(Tenant, slug) is not None


@pytest.mark.parametrize("admits", [True, False])
def test_a_write_session_makes_pending_checks_first(db: Database, admits: bool) -> None:
    check = Check(admits)
    ran: list[bool] = []
    try:
        with carried.carrying():
            carried.defer(check)
            assert carried.pending() == [check]
            try:
                with db.session() as s:
                    ran.append(True)
                    s.add(_tenant("carried-session"))
            except Refused:
                pass
            assert carried.pending() == []  # made, or refused
    except Refused:
        assert not admits  # (the block's end makes the refused check again)
    assert check.made >= 1
    assert ran == ([True] if admits else [])
    assert _exists(db, "carried-session") is admits


@pytest.mark.parametrize("admits", [True, False])
def test_a_group_commit_makes_pending_checks_first(db: Database, admits: bool) -> None:
    committer = GroupCommitter(db)
    check = Check(admits)
    ran: list[bool] = []

    def write(session: Session) -> None:
        ran.append(True)
        session.add(_tenant("carried-batch"))

    try:
        with carried.carrying():
            carried.defer(check)
            with contextlib.suppress(Refused):
                committer.submit(write)
    except Refused:
        assert not admits  # (the block's end makes the refused check again)
    finally:
        committer.close()
    assert ran == ([True] if admits else [])
    assert _exists(db, "carried-batch") is admits


def test_the_block_makes_what_is_left_and_nothing_outside_it_defers() -> None:
    check = Check(True)
    with carried.carrying():
        carried.defer(check)
    assert check.made == 1 and not check.pending
    refused = Check(False)
    with pytest.raises(Refused), carried.carrying():
        carried.defer(refused)
    assert not carried.deferrable() and carried.pending() == []
    with pytest.raises(RuntimeError):
        carried.defer(Check(True))
