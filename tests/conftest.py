"""Shared fixtures: real SQLite files and a real PostgreSQL started for the test session."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from core.clock import Clock, system_clock
from store.db import Database, sqlite_url
from workflows.context import AppContext
from workflows.schema import migrate
from workflows.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

# Property tests draw the same examples on every run (derandomize: a seed derived from the test), so a failure
# in CI reproduces on a laptop and a run's time does not depend on luck; each test states how many it draws.
settings.register_profile("trustfabric", derandomize=True)
settings.load_profile("trustfabric")
SHARED_TESTDATA = ROOT.parent / "shared" / "testdata"

# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set (this machine sets it): the tests start
# the installed binary, servers and agents ~150 times, and each of those processes compiled every module it
# imports from source again (~0.3 s of CPU for the API's). The test processes write the caches as they import
# (__pycache__ is in .gitignore); a process started with the variable set still reads them.
sys.dont_write_bytecode = False

# The tests' files live on tmpfs when the machine has one (/dev/shm): pytest's tmp_path (PYTEST_DEBUG_TEMPROOT,
# read when the session makes its base directory, after this module is imported) and the PostgreSQL clusters.
# Every SQLite database, key file and PostgreSQL database the tests make is written and fsynced, and on a disk
# shared with other work each CREATE DATABASE waited 0.07-0.4 s for its checkpoint (0.03 s on tmpfs). No test
# is about power loss: surviving kill -9 needs no fsync (a killed process leaves the page cache behind).
# Only a tmpfs with room: a container's /dev/shm may be a few MB (Docker's default is 64 MB), and a run needs
# about 1 GB at its peak (the export memory test's logs).
_TMPFS, _TMPFS_NEEDED = Path("/dev/shm"), 4 << 30
TEMP_ROOT: Path | None = (_TMPFS if _TMPFS.is_dir() and os.access(_TMPFS, os.W_OK | os.X_OK)
                          and shutil.disk_usage(_TMPFS).free >= _TMPFS_NEEDED else None)
if TEMP_ROOT is not None:
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(TEMP_ROOT))

# regorus reports errors through Rust's anyhow, which captures a stack backtrace with each one when RUST_BACKTRACE is
# set (this machine sets it) and symbolises it at the first, ~0.25-0.5 s of CPU in each process that meets a regorus
# error (every policy check does: builtin arity is asked of the engine). The binary turns that off for itself
# (cli/main.py); set here, before the workers start, it holds for the test processes and every process they start (a
# deployment's step, a `python -c` script), as it holds for the binary. An explicit RUST_LIB_BACKTRACE is kept.
os.environ.setdefault("RUST_LIB_BACKTRACE", "0")


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
        self.base = Path(tempfile.mkdtemp(prefix="tf-pg-", dir=TEMP_ROOT))
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
        self.start()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._template: str | None = None  # made by the first create_database() that asks for the schema

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.base / "log"), "-w",
             "start"], check=True, capture_output=True,
        )

    def halt(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected), keeping its data for `start`."""
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"],
                       check=True, capture_output=True)

    def _migrated_template(self) -> str:
        """A database migrated once by workflows.schema.migrate: every test database starts as its copy, so a
        test pays CREATE DATABASE (a file copy) and not the migration steps (a few hundred statements)."""
        name = "tf_template"
        url = self._create(name, template="template1")
        db = Database(url)
        try:
            migrate(db.engine)
        finally:
            db.dispose()  # a template must have no open connection while it is copied
        return name

    def _create(self, name: str, *, template: str) -> str:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            # FILE_COPY copies the template's files without writing them to the WAL as well: measured 0.06 s a
            # database against 0.16 s (WAL_LOG, the default), and a smaller cluster to remove at the end.
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def create_database(self, *, migrated: bool = True) -> str:
        """A new database of its own: the current schema with no rows of a test's (`migrated`), else empty."""
        template = "template1"
        if migrated:
            if self._template is None:
                self._template = self._migrated_template()
            template = self._template
        return self._create("t_" + uuid.uuid4().hex[:12], template=template)

    def drop_database(self, url: str) -> None:
        """Remove a database create_database made (its connections ended first), so the cluster stays small."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')

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


@cache
def _migrated_sqlite_image() -> bytes:
    """The bytes of an SQLite database file that workflows.schema.migrate brought to the current schema: made
    once per test process (tests/store/test_migrations.py migrates empty databases step by step)."""
    with tempfile.TemporaryDirectory(prefix="tf-sqlite-template-") as d:
        db = Database(sqlite_url(Path(d)))
        try:
            migrate(db.engine)
        finally:
            db.dispose()  # the last connection closed: SQLite checkpoints its WAL into the file
        if Path(d, "trustfabric.db-wal").exists():
            raise RuntimeError("the template SQLite database kept a WAL file after its last connection closed")
        return Path(d, "trustfabric.db").read_bytes()


def place_migrated_sqlite(data_dir: Path) -> None:
    """A migrated, empty SQLite database where `sqlite_url(data_dir)` opens one (mode 0600, as store.db makes
    it), unless a database is there already: a test pays a file write, not the migration steps."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(data_dir / "trustfabric.db", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as out:
        out.write(_migrated_sqlite_image())


# The settings and the opening of a deployment live here, not in tests/api/conftest.py: the tests that run a step in a
# process of their own (tests/workflows/test_token_keys.py's _as_b) import them there, and the API harness would cost
# each such process ~0.5 s of imports (the app and its routes) it never uses.
TD = "example.org"


def make_settings(home: Path, database_url: str | None = None, **overrides: Any) -> Settings:
    base = Settings(home=home, database_url=database_url, trust_domain=TD, rate_limit_per_second=0,
                    ip_rate_limit_per_second=0, mode="development")
    return replace(base, **overrides)


def open_context(settings: Settings, clock: Clock = system_clock) -> AppContext:
    """AppContext.open(create=True) on a data directory whose SQLite database (when the settings name none
    other) starts as a copy of a migrated one (above): the same schema, without the steps."""
    if settings.database_url is None:
        place_migrated_sqlite(settings.home)
    return AppContext.open(settings, create=True, clock=clock)


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    place_migrated_sqlite(tmp_path)
    db = Database(sqlite_url(tmp_path))
    migrate(db.engine)
    yield db
    db.dispose()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> Iterator[Database]:
    url = postgres_server.create_database()
    db = Database(url)
    migrate(db.engine)
    yield db
    db.dispose()
    postgres_server.drop_database(url)


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Test clients left open (tests/api/conftest.py Client) are closed: their event loop's thread would hold the
    interpreter's exit."""
    harness = sys.modules.get("tests.api.conftest")
    if harness is not None:
        harness.close_open_clients()
