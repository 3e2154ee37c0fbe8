"""PKI fixtures: a file key store unlocked by a key file, a frozen clock, an initialised trust domain
with registered workloads (rows written straight into the inventory tables)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.clock import FrozenClock
from pki import service
from pki.keystore_file import FileKeyStore
from store.db import Database
from tests.pki.helpers import START, TD, register


@pytest.fixture
def keystore(tmp_path: Path) -> FileKeyStore:
    key_file = FileKeyStore.create_key_file(tmp_path / "master.key")
    return FileKeyStore.open(tmp_path / "keys", key_file=key_file)


@pytest.fixture
def clock() -> FrozenClock:
    """Starts at the real now of each test, not of the import: py-spiffe checks a JWT-SVID's expiry against
    the real clock, and in a suite that runs longer than an SVID's five minutes (a loaded machine) a clock
    frozen at import time issued tokens that had already expired."""
    return FrozenClock(max(START, datetime.now(UTC).replace(microsecond=0)))


@pytest.fixture
def pki_db(db: Database, keystore: FileKeyStore, clock: FrozenClock) -> Database:
    """`db` (SQLite and PostgreSQL) with the trust domain initialised and three workloads registered."""
    with db.session() as s:
        assert service.init_trust_domain(s, keystore, trust_domain=TD, clock=clock)
        register(s, "acme", "web", "frontend")
        register(s, "acme", "web", "backend")
        register(s, "globex", "train", "trainer-0")
    return db


@pytest.fixture
def sqlite_pki(sqlite_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> Iterator[Database]:
    with sqlite_db.session() as s:
        service.init_trust_domain(s, keystore, trust_domain=TD, clock=clock)
        register(s, "acme", "web", "frontend")
        register(s, "globex", "train", "trainer-0")
    yield sqlite_db


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory made by the real `trustfabric init`, with acme/web/web-1 registered and a CSR
    in req.pem; for CLI tests (the environment points the CLI at it)."""
    from typer.testing import CliRunner

    from api.cli import app
    from api.config import Settings
    from api.context import AppContext
    from audit import Actor
    from inventory import service as inv
    from tests.pki.helpers import make_csr

    monkeypatch.setenv("TRUSTFABRIC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRUSTFABRIC_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.delenv("TRUSTFABRIC_DATABASE_URL", raising=False)
    r = CliRunner().invoke(app, ["init", "--trust-domain", "example.org", "--json"])
    assert r.exit_code == 0, r.output
    ctx = AppContext.open(Settings.from_env())
    try:
        with ctx.db.session() as s:
            actor = Actor.system("test")
            inv.create_tenant(s, slug="acme", display_name="Acme", actor=actor, clock=ctx.clock)
            inv.create_group(s, tenant="acme", name="web", actor=actor, clock=ctx.clock)
            inv.register_workload(s, trust_domain="example.org", tenant="acme", group="web", name="web-1",
                                  actor=actor, clock=ctx.clock)
    finally:
        ctx.close()
    (tmp_path / "req.pem").write_bytes(make_csr())
    return tmp_path
