"""CA generations: building root and issuing certificates, loading settings and the active CA.

Certificates follow the X509-SVID spec for signing certificates: CA=true (critical), keyCertSign +
cRLSign (critical), the trust domain ID as URI SAN, SKI/AKI so chain builders find the issuer.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import NameOID
from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from core.clock import as_utc
from keys.deployment import read_deployment_id
from keys.errors import WrongMasterKey
from keys.intents import forget, record_intents
from keys.store import KeyKind, KeyStore, PublicKey, Signer, hash_for
from pki.errors import CAUnavailable, ForeignKeyStore, NotInitialized
from pki.models import CertificateAuthority, TrustDomainSettings
from pki.schedule import NOT_INITIALIZED
from pki.spiffe_id import SpiffeId
from store.db import Database

# SPIRE backdates NotBefore a little so that peers with slightly slow clocks accept new certs.
BACKDATE = timedelta(seconds=10)
PUBLISHED_STATES = ("prepared", "active", "retiring")

# The key ids create_generation gives a generation's keys (root, issuing, JWT-SVID): the only ids
# unused_ca_key_ids ever names, so an audit, API-issuer or any other key is never taken for an unused CA key.
CA_KEY_ID_RE = re.compile(r"^(?:ca-g[0-9]+-(?:root|issuing)|jwt-g[0-9]+)-[0-9a-f]{8}$")

CERT_CACHE_SIZE = 64  # CA certificates in use at once: a few generations x (root, issuing), per trust domain
_cert_cache: OrderedDict[str, x509.Certificate] = OrderedDict()
_cache_lock = threading.Lock()


def truncate(ts: datetime) -> datetime:
    """X.509 times have second precision; store exactly what the certificate says."""
    return ts.replace(microsecond=0)


def load_settings(session: Session) -> TrustDomainSettings:
    """The trust domain settings, or NotInitialized."""
    row = session.get(TrustDomainSettings, 1)
    if row is None:
        raise NotInitialized(NOT_INITIALIZED)
    return row


def certificate(ca: CertificateAuthority) -> x509.Certificate:
    """The CA's parsed certificate. Cached by its PEM text, so the entry is exact whatever database or trust
    domain the row came from (the parse is a pure function of the text); least recently used entries go
    first beyond CERT_CACHE_SIZE."""
    key = ca.cert_pem
    with _cache_lock:
        cert = _cert_cache.get(key)
        if cert is not None:
            _cert_cache.move_to_end(key)
            return cert
    cert = x509.load_pem_x509_certificate(key.encode())
    with _cache_lock:
        _cert_cache[key] = cert
        while len(_cert_cache) > CERT_CACHE_SIZE:
            _cert_cache.popitem(last=False)
    return cert


def _ca_name(td: str, role: str, generation: int) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trustfabric"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, td[:64]),
            x509.NameAttribute(NameOID.COMMON_NAME, f"trustfabric {role} CA g{generation}"),
        ]
    )


def _ca_extensions(
    builder: x509.CertificateBuilder, *, public: PublicKey, td: str, path_length: int | None
) -> x509.CertificateBuilder:
    return (
        builder.add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(SpiffeId(td, "")))]),
            critical=False,
        )
    )


def sign_certificate(builder: x509.CertificateBuilder, signer: Signer) -> x509.Certificate:
    """Sign with a key store key (the private key never leaves the store: PKCS#11 keys sign in the token)."""
    return builder.sign(signer.private_key(), hash_for(signer.kind))  # type: ignore[arg-type]


@dataclass(frozen=True)
class GenerationKeys:
    """The key ids of one CA generation, chosen before its keys are made (root, issuing, JWT-SVID). The suffix is
    random: a retry never collides with a rolled-back attempt's key (a file a killed process left, say);
    CA_KEY_ID_RE matches these names."""

    generation: int
    suffix: str

    @classmethod
    def new(cls, generation: int) -> GenerationKeys:
        return cls(generation, secrets.token_hex(4))

    @property
    def root(self) -> str:
        return f"ca-g{self.generation}-root-{self.suffix}"

    @property
    def issuing(self) -> str:
        return f"ca-g{self.generation}-issuing-{self.suffix}"

    @property
    def jwt(self) -> str:
        return f"jwt-g{self.generation}-{self.suffix}"

    @property
    def ids(self) -> tuple[str, str, str]:
        return (self.root, self.issuing, self.jwt)


def _latest_generation(session: Session) -> int | None:
    return session.exec(select(CertificateAuthority.generation).order_by(
        col(CertificateAuthority.generation).desc()).limit(1)).first()


def reserve_generation_keys(db: Database, now: datetime) -> GenerationKeys | None:
    """Choose the key ids of the next CA generation and commit their intents (keys/intents.py), in a transaction of
    its own, before the transaction that makes them begins: what lets a start destroy them should that transaction's
    process be killed before its commit. Read without a lock: when another replica makes that generation first, the
    reservation does not fit and create_generation makes keys without intents (which are then never destroyed by a
    start, only listed). None when this database has no deployment id yet (its token keys are unmarked)."""
    with db.read_session() as session:
        latest = _latest_generation(session)
        deployment_id = read_deployment_id(session.connection())
    if deployment_id is None:
        return None
    keys = GenerationKeys.new(1 if latest is None else latest + 1)
    record_intents(db, keys.ids, deployment_id, now)
    return keys


def create_generation(
    session: Session,
    keystore: KeyStore,
    settings: TrustDomainSettings,
    *,
    state: str,
    now: datetime,
    kind: KeyKind | None = None,
    reserved: GenerationKeys | None = None,
) -> tuple[CertificateAuthority, CertificateAuthority]:
    """Generate keys and certificates for the next root + issuing CA pair and add their rows. With `reserved` (ids
    whose intents committed before this transaction began: reserve_generation_keys) of this generation, its ids, and
    their intents are deleted in this transaction: the CA rows name the keys from its commit on."""
    latest = _latest_generation(session)
    generation = 1 if latest is None else latest + 1
    kind = KeyKind(kind or settings.key_kind)
    td = settings.trust_domain
    not_before = truncate(now) - BACKDATE
    not_after = truncate(now) + timedelta(seconds=settings.ca_ttl_seconds)
    ids = reserved if reserved is not None and reserved.generation == generation else GenerationKeys.new(generation)
    root_key = keystore.generate(ids.root, kind)
    issuing_key = keystore.generate(ids.issuing, kind)
    jwt_key = keystore.generate(ids.jwt, KeyKind.EC_P256)

    root_name = _ca_name(td, "root", generation)
    root_builder = (
        x509.CertificateBuilder()
        .subject_name(root_name)
        .issuer_name(root_name)
        .public_key(root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    root_cert = sign_certificate(
        _ca_extensions(root_builder, public=root_key.public_key(), td=td, path_length=1), root_key
    )
    root_ski = root_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    issuing_builder = (
        x509.CertificateBuilder()
        .subject_name(_ca_name(td, "issuing", generation))
        .issuer_name(root_name)
        .public_key(issuing_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(root_ski), critical=False)
    )
    issuing_cert = sign_certificate(
        _ca_extensions(issuing_builder, public=issuing_key.public_key(), td=td, path_length=0), root_key
    )
    common = {"generation": generation, "state": state, "key_kind": kind.value, "not_before": not_before,
              "not_after": not_after, "created_at": now}
    root = CertificateAuthority(
        id=f"g{generation}-root", role="root", key_id=root_key.key_id,
        cert_pem=root_cert.public_bytes(serialization.Encoding.PEM).decode(), **common,  # type: ignore[arg-type]
    )
    issuing = CertificateAuthority(
        id=f"g{generation}-issuing", role="issuing", parent_id=root.id, key_id=issuing_key.key_id,
        jwt_key_id=jwt_key.key_id, jwt_kid=secrets.token_urlsafe(16),
        jwt_public_pem=jwt_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
        cert_pem=issuing_cert.public_bytes(serialization.Encoding.PEM).decode(), **common,  # type: ignore[arg-type]
    )
    if state == "active":
        root.activated_at = issuing.activated_at = now
    session.add(root)
    session.add(issuing)
    session.flush()
    if ids is reserved:
        forget(session.connection(), ids.ids)
    return root, issuing


def generation_cas(session: Session, states: Sequence[str]) -> list[CertificateAuthority]:
    """CA rows in the given states, oldest generation first, root before issuing."""
    rows = session.exec(
        select(CertificateAuthority)
        .where(col(CertificateAuthority.state).in_(list(states)))
        .order_by(col(CertificateAuthority.generation), col(CertificateAuthority.role).desc())
    ).all()
    return list(rows)


def key_ids_in_use(session: Session) -> list[str]:
    """The key ids of every CA generation still in use: its CA key and its JWT-SVID key."""
    ids = []
    for ca in generation_cas(session, ("prepared", "active", "retiring")):
        ids.append(ca.key_id)
        if ca.jwt_key_id is not None:
            ids.append(ca.jwt_key_id)
    return ids


def unused_ca_key_ids(session: Session, key_ids: Iterable[str], *, lock: bool = True) -> list[str]:
    """Those of `key_ids` named as create_generation names a generation's keys that no CA row names, in any state
    (a retired generation's keys are kept): keys of a generation whose transaction rolled back. [] before init.

    With `lock` (in a write transaction), exact: the trust domain settings row is locked first, as a rotation locks
    it before it makes keys and holds it until it commits (on SQLite the write transaction holds the writer lock
    already). So any rotation under way has committed (its CA rows are read below: PostgreSQL's READ COMMITTED gives
    the next statement a new snapshot) or rolled back, and a key it made is never taken for unused. The only other
    maker of CA keys, init_trust_domain, inserts the settings row in the same transaction: until it commits there is
    no row, and no key is unused. Without `lock`, a cheap first look that may name a key a rotation under way makes."""
    candidates = sorted({k for k in key_ids if CA_KEY_ID_RE.fullmatch(k)})
    if not candidates:
        return []
    stmt = select(TrustDomainSettings.id).where(TrustDomainSettings.id == 1)
    if session.exec(stmt.with_for_update() if lock else stmt).first() is None:
        return []
    used: set[str] = set()
    for key_id, jwt_key_id in session.exec(select(CertificateAuthority.key_id, CertificateAuthority.jwt_key_id)):
        used.add(key_id)
        if jwt_key_id is not None:
            used.add(jwt_key_id)
    return [k for k in candidates if k not in used]


def check_keys(session: Session, keystore: KeyStore) -> None:
    """ForeignKeyStore unless `keystore` holds the key of every CA generation still in use (and its JWT-SVID
    key), each the key its certificate names: a process opening a trust domain made elsewhere must bring the
    key store it was made with, else it would sign what no other replica trusts."""
    def spki(key: PublicKeyTypes) -> bytes:
        return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    for ca in generation_cas(session, ("prepared", "active", "retiring")):
        expected = [(ca.key_id, spki(certificate(ca).public_key()))]
        if ca.jwt_key_id is not None and ca.jwt_public_pem is not None:
            expected.append((ca.jwt_key_id, spki(serialization.load_pem_public_key(ca.jwt_public_pem.encode()))))
        for key_id, public in expected:
            try:
                held = keystore.exists(key_id)
            except WrongMasterKey as exc:  # published by a replica (keys/shared.py) under another master key
                raise ForeignKeyStore(f"the key store has no key {key_id!r} (CA {ca.id}): {exc}") from None
            if not held:
                raise ForeignKeyStore(f"the key store has no key {key_id!r} (CA {ca.id})")
            if spki(keystore.get(key_id).public_key()) != public:
                raise ForeignKeyStore(f"the key store's key {key_id!r} is not the one CA {ca.id} uses")


def active_issuing(session: Session, now: datetime, *, lock: bool = True) -> CertificateAuthority:
    """The issuing CA that signs now (row-locked on PostgreSQL so rotation cannot race), or CAUnavailable."""
    stmt = select(CertificateAuthority).where(
        CertificateAuthority.state == "active", CertificateAuthority.role == "issuing"
    )
    if lock:
        stmt = stmt.with_for_update()
    ca = session.exec(stmt).first()
    if ca is None and lock:
        # PostgreSQL, READ COMMITTED: a rotation that committed while we waited for the row lock
        # hides both rows from this statement's snapshot; the next statement sees the new active CA.
        ca = session.exec(stmt).first()
    if ca is None:
        load_settings(session)
        raise CAUnavailable("no active issuing CA: run `trustfabric ca rotate`")
    if as_utc(ca.not_after) <= now:
        raise CAUnavailable(f"the active issuing CA {ca.id} expired at {ca.not_after.isoformat()}: "
                            "run `trustfabric ca rotate --force`")
    return ca


def root_of(session: Session, issuing: CertificateAuthority) -> CertificateAuthority:
    root = session.get(CertificateAuthority, issuing.parent_id)
    if root is None:
        raise CAUnavailable(f"issuing CA {issuing.id} has no root row")
    return root


def extend_signed_until(ca: CertificateAuthority, expiry: datetime) -> None:
    """Keep the CA published at least until `expiry` (the latest thing it signed)."""
    if ca.signed_until is None or as_utc(ca.signed_until) < expiry:
        ca.signed_until = expiry


_published: dict[tuple[str, str], datetime] = {}  # (database URL, CA id): a signed_until this process knows stored
_raising: dict[tuple[str, str], threading.Lock] = {}  # one raise at a time per CA and database
_published_lock = threading.Lock()


def publish_until(db: Database, ca: CertificateAuthority, expiry: datetime) -> None:
    """The CA's signed_until raised to `expiry` (never lowered), committed in a transaction of its own, unless this
    process knows it is stored already (`ca` as read, or its own last raise): what a group-committed issuance does
    before handing its SVID to the batch. In the batch the row would be written under the audit head's lock, the
    other way round from every transaction that locks the CA row first and appends after (a JWT-SVID, a node's
    certificate, a rotation): a deadlock PostgreSQL breaks after a second. Raised first, the CA is published at
    least as long as every SVID it signed at any moment, even one whose batch then fails. X.509 times have second
    precision, so a process raises it at most once a second: one caller raises, and the others of that second wait
    for its commit (each raising for itself, 64 requesters made a burst of transactions on one row every second)."""
    key = (db.url, ca.id)
    if _known_until(key, ca) >= expiry:
        return
    with _published_lock:
        raising = _raising.setdefault(key, threading.Lock())
    with raising:
        if _known_until(key, ca) >= expiry:  # raised meanwhile, by the caller this one waited for
            return
        table = CertificateAuthority.__table__  # type: ignore[attr-defined]
        with db.session() as session:
            session.connection().execute(
                update(table).where(table.c.id == ca.id,
                                    or_(table.c.signed_until.is_(None), table.c.signed_until < expiry))
                .values(signed_until=expiry))
        with _published_lock:
            if _published.get(key) is None or _published[key] < expiry:
                _published[key] = expiry


def _known_until(key: tuple[str, str], ca: CertificateAuthority) -> datetime:
    """The latest signed_until this process knows stored for the CA (signed_until only ever grows)."""
    with _published_lock:
        known = _published.get(key)
    stored = as_utc(ca.signed_until) if ca.signed_until is not None else None
    candidates = [t for t in (known, stored) if t is not None]
    return max(candidates) if candidates else datetime.min.replace(tzinfo=UTC)
