"""Shared fixtures: real SQLite files and a real PostgreSQL started for the test session."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.db import Database, sqlite_url
from workflows.schema import migrate

ROOT = Path(__file__).resolve().parent.parent
SHARED_TESTDATA = ROOT.parent / "shared" / "testdata"


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A throwaway cluster: its own data dir, port and socket dir; removed at the end of the session."""

    def __init__(self) -> None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("PostgreSQL server binaries not installed (Debian package postgresql)")
        self.pg_ctl = pg_ctl
        self.base = Path(tempfile.mkdtemp(prefix="tf-pg-"))
        self.data = self.base / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            # initdb refuses to run as root: the cluster belongs to the postgres user.
            shutil.chown(self.base, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            [*self.as_user, initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, capture_output=True,
        )
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            [*self.as_user, pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.base / "log"), "-w", "start"],
            check=True, capture_output=True,
        )
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"],
            check=False, capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except (RuntimeError, subprocess.CalledProcessError, KeyError, LookupError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot start PostgreSQL: {exc} {detail.decode(errors='replace')[:300]}")
    yield server
    server.stop()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(sqlite_url(tmp_path))
    migrate(db.engine)
    yield db
    db.dispose()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[Database]:
    db = Database(postgres_server.create_database())
    migrate(db.engine)
    yield db
    db.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest) -> Database:
    """A migrated, empty database: every store-touching test runs on both real backends."""
    return request.getfixturevalue(f"{request.param}_db")  # type: ignore[no-any-return]


CHROMIUM = Path("/usr/bin/chromium")
# What this closed machine needs: no sandbox (root in a container), no GPU, no network beyond 127.0.0.1.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One Debian chromium for the whole test session, driven by Playwright (never a downloaded browser); shared by
    the console's browser tests and the API's /docs test. While it lives, Playwright's event loop runs in this
    worker's main thread: a test that needs asyncio.run does it on a thread of its own (tests/core/test_asgi.py)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; `make test` installs it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
