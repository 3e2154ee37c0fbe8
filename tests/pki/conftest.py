"""PKI fixtures: a file key store unlocked by a key file, a frozen clock, an initialised trust domain
with registered workloads (rows written straight into the inventory tables)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.clock import FrozenClock
from keys.file import FileKeyStore
from pki import service
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
