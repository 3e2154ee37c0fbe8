"""Workflow tests run on a real data directory and database (SQLite file or the session's PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import make_settings, open_context
from workflows.context import AppContext


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    """An opened (not yet initialised) data directory on each real database."""
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    c = open_context(make_settings(tmp_path / "home", url))
    yield c
    c.close()
