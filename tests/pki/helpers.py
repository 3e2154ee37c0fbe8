"""Helpers for the PKI tests: registration rows, CSRs, chain verification, row counts."""

from __future__ import annotations

import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store
from sqlmodel import Session, func, select

from audit import Actor
from audit.models import AuditEvent
from inventory.models import Tenant, Workload, WorkloadGroup
from pki.models import IssuedSvid
from store.db import Database

TD = "example.org"
ADMIN = Actor(id="admin", kind="admin")
# real "now" (to the second): py-spiffe, pyjwt and openssl check times against the real clock
START = datetime.now(UTC).replace(microsecond=0)


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



def openssl_csr(key_type: str, digest: str) -> bytes:
    """A CSR made and signed by the openssl command with a fresh key ("ec" P-256 or "rsa" 2048) and `digest`
    (sha1, md5: the library refuses to sign with those, as a legacy client's openssl does not)."""
    with tempfile.TemporaryDirectory(prefix="tf-csr-") as tmp:
        key = Path(tmp) / "key.pem"
        make = (["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)] if key_type == "ec"
                else ["openssl", "genrsa", "-out", str(key), "2048"])
        subprocess.run(make, check=True, capture_output=True)
        return subprocess.run(["openssl", "req", "-new", "-key", str(key), "-subj", "/CN=legacy", f"-{digest}"],
                              check=True, capture_output=True).stdout


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



def verify_chain(issued_pem: bytes, chain_pems: list[bytes], roots_pem: bytes, at: datetime) -> list[x509.Certificate]:
    """Build leaf -> issuing -> root with cryptography's verifier; raises VerificationError otherwise."""
    store = Store(x509.load_pem_x509_certificates(roots_pem))
    verifier = PolicyBuilder().store(store).time(at).build_client_verifier()
    leaf = x509.load_pem_x509_certificate(issued_pem)
    intermediates = [x509.load_pem_x509_certificate(p) for p in chain_pems]
    return list(verifier.verify(leaf, intermediates).chain)


def self_signed_pem(name: str) -> str:
    """A throwaway self-signed certificate (PEM) named `name`, for tests of certificate handling."""
    from datetime import UTC, timedelta

    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = make_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()
