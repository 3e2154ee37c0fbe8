"""Workflow tests run on a real data directory and database (SQLite file or the session's PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keys.pkcs11 import Pkcs11KeyStore
from tests.conftest import make_settings, open_context
from tests.keys.stores import softhsm_token
from workflows.context import AppContext

Token = tuple[str, str]  # (module, label)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    """An opened (not yet initialised) data directory on each real database."""
    url = request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None
    c = open_context(make_settings(tmp_path / "home", url))
    yield c
    c.close()


@pytest.fixture
def token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Token:
    """One SoftHSM2 token, which every deployment of the test shares (SOFTHSM2_CONF in the environment)."""
    return softhsm_token(tmp_path, monkeypatch)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_database(request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """A new database of its own for each call: a PostgreSQL database's URL, or None (the data directory's SQLite)."""
    if request.param == "sqlite":
        return lambda: None
    server = request.getfixturevalue("postgres_server")
    return server.create_database  # type: ignore[no-any-return]


@pytest.fixture
def deployments() -> Iterator[list[AppContext]]:
    """The token deployments' contexts a test opens, closed at its end (token session and database)."""
    opened: list[AppContext] = []
    yield opened
    for ctx in opened:
        assert isinstance(ctx.keystore, Pkcs11KeyStore)
        ctx.keystore.close()
        ctx.close()
