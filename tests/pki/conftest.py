"""PKI fixtures: a file key store unlocked by a key file, a frozen clock, an initialised trust domain
with registered workloads (rows written straight into the inventory tables), CSR helpers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlmodel import Session, func, select

from audit import Actor
from audit.models import AuditEvent
from core.clock import FrozenClock
from inventory.models import Tenant, Workload, WorkloadGroup
from pki import service
from pki.keystore_file import FileKeyStore
from pki.models import IssuedSvid
from store.db import Database

TD = "example.org"
ADMIN = Actor(id="admin", kind="admin")
START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def keystore(tmp_path: Path) -> FileKeyStore:
    key_file = FileKeyStore.create_key_file(tmp_path / "master.key")
    return FileKeyStore.open(tmp_path / "keys", key_file=key_file)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


def register(session: Session, tenant: str, group: str, workload: str, *, td: str = TD,
             spiffe_id: str | None = None) -> None:
    """Insert inventory rows directly (the inventory service is another package's work)."""
    if session.get(Tenant, tenant) is None:
        session.add(Tenant(slug=tenant, display_name=tenant, created_at=START))
        session.flush()
    if session.exec(select(WorkloadGroup).where(WorkloadGroup.tenant == tenant,
                                                WorkloadGroup.name == group)).first() is None:
        session.add(WorkloadGroup(tenant=tenant, name=group, created_at=START))
    session.add(Workload(tenant=tenant, group=group, name=workload,
                         spiffe_id=spiffe_id or f"spiffe://{td}/tenant/{tenant}/group/{group}/{workload}",
                         created_at=START))
    session.flush()


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


def make_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_csr(key: ec.EllipticCurvePrivateKey | None = None, *, sans: list[x509.GeneralName] | None = None,
             ca: bool = False, cn: str = "whatever") -> bytes:
    key = key or make_key()
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def counts(db: Database) -> tuple[int, int]:
    """(SVID rows, audit events): what a rejected request must leave unchanged."""
    with db.read_session() as s:
        svids = s.exec(select(func.count()).select_from(IssuedSvid)).one()
        events = s.exec(select(func.count()).select_from(AuditEvent)).one()
    return int(svids), int(events)


def actions(db: Database) -> list[str]:
    with db.read_session() as s:
        return [e.action for e in s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all()]  # type: ignore[arg-type]
