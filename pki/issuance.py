"""The one path every X.509 certificate for an identity takes: TTL rules, signing by the active issuing
CA, the SVID row and the audit event, all in the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from sqlalchemy import event, insert
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import SessionTransaction
from sqlmodel import Session

from audit import Actor, record_only
from core.clock import Clock, as_utc
from keys.store import KeyStore
from pki.ca import BACKDATE, active_issuing, certificate, extend_signed_until, truncate
from pki.errors import CAUnavailable, InvalidTTL, IssuerChanged, TTLTooLong
from pki.models import CertificateAuthority, IssuedSvid
from pki.spiffe_id import SpiffeId
from pki.x509svid import LeafPublicKey, build_leaf
from store import deferred
from store.db import driver_write, driver_write_many


@dataclass(frozen=True)
class IssuedX509:
    """An issued X.509-SVID: the leaf, the chain up to (not including) the root, and its facts."""

    cert_pem: bytes
    chain_pem: list[bytes]
    serial: str
    spiffe_id: str
    expires_at: datetime
    issuer_ca_id: str

    @property
    def full_chain_pem(self) -> bytes:
        """Leaf followed by the issuing CA: what a TLS peer presents."""
        return self.cert_pem + b"".join(self.chain_pem)


@dataclass(frozen=True)
class IssuedJWT:
    token: str
    spiffe_id: str
    audience: list[str]
    expires_at: datetime
    kid: str
    issued_at: datetime


def resolve_ttl(
    ttl: timedelta | None, *, default_seconds: int, max_seconds: int, what: str, cap: timedelta | None = None
) -> timedelta:
    """The requested TTL (or the default); InvalidTTL when not positive, TTLTooLong above the maximum
    (the trust domain's, tightened by `cap` when the deployment configures a lower one)."""
    if cap is not None:
        max_seconds = min(max_seconds, int(cap.total_seconds()))
        default_seconds = min(default_seconds, max_seconds)
    if ttl is None:
        return timedelta(seconds=default_seconds)
    if not isinstance(ttl, timedelta):
        raise InvalidTTL(f"{what} TTL must be a duration")
    if ttl <= timedelta(0):
        raise InvalidTTL(f"{what} TTL must be positive, got {ttl.total_seconds():g} s")
    if ttl > timedelta(seconds=max_seconds):
        raise TTLTooLong(
            f"{what} TTL of {int(ttl.total_seconds())} s is above the maximum of {max_seconds} s"
        )
    return ttl


@dataclass(frozen=True)
class SignedLeaf:
    """A leaf signed by the active issuing CA and not yet recorded: never handed out before `record_issued`
    committed its row and audit event."""

    cert: x509.Certificate
    issuer_cert: x509.Certificate
    issuer_ca_id: str
    serial: str
    spiffe_id: SpiffeId
    issued_at: datetime
    not_before: datetime
    not_after: datetime


def sign_leaf(
    session: Session | None,
    keystore: KeyStore,
    *,
    public_key: LeafPublicKey,
    spiffe_id: SpiffeId,
    ttl: timedelta,
    clock: Clock,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    lock: bool = True,
    issuer: CertificateAuthority | None = None,
    subject: x509.Name | None = None,
) -> SignedLeaf:
    """Sign with the active issuing CA (never beyond its expiry); writes nothing. `lock=False` reads the CA
    without a row lock (a read-only session, before a group commit records it); `issuer`: the CA last seen
    active (then no session is needed), which record_issued checks is still the active one when it records;
    `subject`: pki.x509svid.leaf_subject(spiffe_id), kept by the caller."""
    now = clock()
    if issuer is None:
        if session is None:
            raise ValueError("sign_leaf needs a session or the issuer")
        issuer = active_issuing(session, now, lock=lock)
    issuer_not_after = as_utc(issuer.not_after)
    not_before = truncate(now) - BACKDATE
    not_after = min(truncate(now + ttl), issuer_not_after)  # an SVID never outlives its issuer
    if not_after <= now:
        raise CAUnavailable(f"issuing CA {issuer.id} expires now; run `trustfabric ca rotate --force`")
    issuer_cert = certificate(issuer)
    signer = keystore.get(issuer.key_id)
    serial = x509.random_serial_number()
    cert = build_leaf(
        public_key=public_key, spiffe_id=spiffe_id, issuer_cert=issuer_cert, issuer_key=signer,
        serial=serial, not_before=not_before, not_after=not_after, dns_names=dns_names,
        ip_addresses=ip_addresses, subject=subject,
    )
    return SignedLeaf(cert, issuer_cert, issuer.id, format(serial, "x"), spiffe_id, now, not_before, not_after)


_HELD_ISSUERS = "tf_issuers"
_INSERT_SVID = insert(IssuedSvid.__table__)  # type: ignore[attr-defined]


@event.listens_for(OrmSession, "after_transaction_end")
def _drop_held_issuers(session: OrmSession, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the next transaction reads the CA afresh
        session.info.pop(_HELD_ISSUERS, None)


def signing_issuer(session: Session, signed: SignedLeaf) -> CertificateAuthority:
    """The CA that signed `signed`, still the active issuing CA in this transaction, or IssuerChanged. Held by
    the session (session.info) for the rest of its transaction: the identity map holds an unmodified object
    weakly, so without it every issuance of a group commit loaded the CA row again."""
    held: dict[str, CertificateAuthority] = session.info.setdefault(_HELD_ISSUERS, {})
    issuer = held.get(signed.issuer_ca_id)  # what session.get would answer from its identity map, cheaper
    if issuer is None:
        issuer = session.get(CertificateAuthority, signed.issuer_ca_id)
        if issuer is not None:
            held[issuer.id] = issuer
    if issuer is None or issuer.state != "active" or issuer.role != "issuing":
        raise IssuerChanged(f"issuing CA {signed.issuer_ca_id} is no longer the active one; sign again")
    return issuer


def record_issued(
    session: Session,
    signed: SignedLeaf,
    *,
    kind: str,
    actor: Actor,
    action: str,
    tenant: str | None = None,
    group: str | None = None,
    workload: str | None = None,
    node: str | None = None,
    extra_summary: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    published: bool = False,
) -> IssuedX509:
    """Persist the SVID row, keep its CA published until it expires (unless `published`: pki.ca.publish_until
    did, before), record the event: only writes, from values computed before, so a group commit may run it again
    in a transaction of its own."""
    issuer = signing_issuer(session, signed)
    spiffe_id = str(signed.spiffe_id)
    # a Core insert: building the SQLModel object (validation, ORM state) cost more than the statement; in a
    # group commit's batch, one executemany for all its SVIDs (store/deferred.py)
    row = {
        "serial": signed.serial, "kind": kind, "spiffe_id": spiffe_id, "tenant": tenant,
        "group": group, "workload": workload, "node": node, "issuer_ca_id": issuer.id,
        "not_before": signed.not_before, "not_after": signed.not_after, "revoked_at": None,
        "revocation_reason": None, "created_at": signed.issued_at,
    }
    rows: list[dict[str, Any]] | None = deferred.batched(session, "pki.svid", list, lambda q: _insert_svids(session, q))
    if rows is None:
        _insert_svids(session, [row])
    else:
        rows.append(row)
    if not published:
        extend_signed_until(issuer, signed.not_after)  # the row is in the session (signing_issuer): flushed with it
    record_only(
        session, actor=actor, action=action, object_type="svid", object_id=signed.serial, tenant=tenant,
        summary={"serial": signed.serial, "spiffe_id": spiffe_id, "kind": kind, "issuer": issuer.id,
                 "not_after": signed.not_after.isoformat(), **(extra_summary or {})},
        at=signed.issued_at, request_id=request_id,
    )
    return IssuedX509(
        cert_pem=signed.cert.public_bytes(serialization.Encoding.PEM),
        chain_pem=[issuer.cert_pem.encode()],  # the issuer's PEM as stored: what public_bytes gave when created
        serial=signed.serial, spiffe_id=spiffe_id, expires_at=signed.not_after,
        issuer_ca_id=issuer.id,
    )


_SVID_COLUMNS = ("serial", "kind", "spiffe_id", "tenant", "group", "workload", "node", "issuer_ca_id", "not_before",
                 "not_after", "revoked_at", "revocation_reason", "created_at")
_SVID_TIMES = ("not_before", "not_after", "created_at")  # revoked_at is None: a new SVID
_SVID_NAMES = ", ".join(f'"{c}"' for c in _SVID_COLUMNS)
_SVID_SQLITE = f"INSERT INTO pki_svids ({_SVID_NAMES}) VALUES ({', '.join('?' * len(_SVID_COLUMNS))})"  # noqa: S608
_SVID_TYPES = ", ".join(f'"{c}" {"timestamptz" if c in (*_SVID_TIMES, "revoked_at") else "text"}'
                        for c in _SVID_COLUMNS)
# PostgreSQL: every row in one statement, as one JSON array the server takes apart (psycopg adapting each row's
# thirteen parameters, three of them times, cost more client CPU than the rest of the insert)
_SVID_PG = (f"INSERT INTO pki_svids ({_SVID_NAMES}) SELECT {_SVID_NAMES} "  # noqa: S608
            f"FROM json_to_recordset(%s::json) AS r({_SVID_TYPES})")


def _insert_svids(session: Session, rows: list[dict[str, Any]]) -> None:
    """The rows in one statement (one executemany on SQLite), straight to the driver on SQLite and psycopg:
    SQLAlchemy's per-row parameter processing cost ~20 us of CPU per SVID, more than the insert. Times are
    written in SQLAlchemy's own SQLite form, so they read back alike; any other driver through SQLAlchemy."""
    conn = session.connection()
    dialect = conn.dialect
    if dialect.name == "sqlite" and dialect.driver == "pysqlite":
        values = []
        for row in rows:
            value = [row[c] for c in _SVID_COLUMNS]
            for i in (8, 9, 12):  # _SVID_TIMES, as strftime('%Y-%m-%d %H:%M:%S.%f') has them, faster
                value[i] = value[i].replace(tzinfo=None).isoformat(" ", "microseconds")
            values.append(value)
        driver_write_many(conn, _SVID_SQLITE, values)
    elif dialect.name == "postgresql" and dialect.driver == "psycopg":
        data = [{**row, "not_before": row["not_before"].isoformat(), "not_after": row["not_after"].isoformat(),
                 "created_at": row["created_at"].isoformat()} for row in rows]
        driver_write(conn, _SVID_PG, (json.dumps(data, ensure_ascii=False),))
    else:
        conn.execute(_INSERT_SVID, rows)


def issue_certificate(
    session: Session,
    keystore: KeyStore,
    *,
    public_key: LeafPublicKey,
    spiffe_id: SpiffeId,
    ttl: timedelta,
    kind: str,
    actor: Actor,
    clock: Clock,
    action: str,
    tenant: str | None = None,
    group: str | None = None,
    workload: str | None = None,
    node: str | None = None,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    extra_summary: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> IssuedX509:
    """Sign with the active issuing CA (never beyond its expiry), persist the SVID, record the event."""
    signed = sign_leaf(session, keystore, public_key=public_key, spiffe_id=spiffe_id, ttl=ttl, clock=clock,
                       dns_names=dns_names, ip_addresses=ip_addresses)
    return record_issued(session, signed, kind=kind, actor=actor, action=action, tenant=tenant, group=group,
                         workload=workload, node=node, extra_summary=extra_summary, request_id=request_id)
