"""Revocation: one SVID by serial, or every SVID of a workload, group or tenant (the identity itself is
then revoked: no new SVIDs, and the enforcer withdraws its flows). CRLs are signed per issuing CA."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from sqlmodel import Session, col, func, select

from audit import Actor, record
from core.clock import Clock, as_utc
from core.errors import InvalidInput
from core.slugs import require_slug
from inventory.models import Tenant, Workload, WorkloadGroup
from keys.store import KeyStore, hash_for
from pki.ca import PUBLISHED_STATES, certificate, generation_cas, load_settings, truncate
from pki.errors import AlreadyRevoked, IdentityNotFound, IdentityOutOfScope, SvidNotFound
from pki.models import CertificateAuthority, IssuedSvid, RevokedIdentity
from pki.spiffe_id import SpiffeId, identity_prefix, parse_spiffe_id

MAX_REASON = 500
CRL_VALIDITY = timedelta(hours=1)
_SERIAL_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class RevokedIdentityInfo:
    spiffe_id_prefix: str
    tenant: str
    group: str | None
    workload: str | None
    reason: str
    revoked_at: datetime


def _check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a revocation needs a reason (it goes to the audit log)")
    if len(reason) > MAX_REASON:
        raise InvalidInput(f"reason is longer than {MAX_REASON} characters")
    return reason.strip()


def check_request(*, serial: str | None, tenant: str | None, group: str | None, workload: str | None,
                  reason: str) -> str:
    """The reason, stripped, when these name one thing to revoke (a serial in hex, or a tenant, optionally with a
    group and a workload of it); InvalidInput otherwise. Reads nothing: the CLI asks it before any work, so that a
    wrong combination is a usage error there."""
    reason = _check_reason(reason)
    if serial is not None:
        if tenant is not None or group is not None or workload is not None:
            raise InvalidInput("revoke either by serial or by tenant/group/workload, not both")
        _serial(serial)
        return reason
    if tenant is None:
        raise InvalidInput("name what to revoke: a serial, or a tenant (optionally with group and workload)")
    require_slug(tenant, "tenant")
    if group is not None:
        require_slug(group, "group")
    if workload is not None and group is None:
        raise InvalidInput("a workload is named within a group: give the group too")
    return reason


def _serial(serial: str) -> str:
    """A certificate serial as stored: lower-case hex without leading zeros; InvalidInput for anything else."""
    norm = serial.strip().lower().removeprefix("0x").replace(":", "")
    if not norm or len(norm) > 40 or set(norm) - _SERIAL_CHARS:
        raise InvalidInput("serial must be the certificate serial number in hex (up to 40 hex digits)")
    return norm.lstrip("0") or "0"


def revoke(
    session: Session,
    *,
    serial: str | None = None,
    tenant: str | None = None,
    group: str | None = None,
    workload: str | None = None,
    reason: str,
    actor: Actor,
    scope_tenant: str | None,
    clock: Clock,
    request_id: str | None = None,
) -> list[str]:
    """Revoke one SVID (serial) or an identity (tenant[/group[/workload]]); returns the serials revoked."""
    reason = check_request(serial=serial, tenant=tenant, group=group, workload=workload, reason=reason)
    now = clock()
    if serial is not None:
        return [_revoke_serial(session, serial, reason, actor, scope_tenant, now, request_id)]
    assert tenant is not None  # check_request
    if scope_tenant is not None and tenant != scope_tenant:
        raise IdentityOutOfScope(f"tenant {scope_tenant!r} may only revoke identities under /tenant/{scope_tenant}/")
    settings = load_settings(session)
    prefix = identity_prefix(settings.trust_domain, tenant, group, workload)
    stmt = select(IssuedSvid).where(IssuedSvid.tenant == tenant, col(IssuedSvid.revoked_at).is_(None))
    if group is not None:
        stmt = stmt.where(IssuedSvid.group == group)
    if workload is not None:
        stmt = stmt.where(IssuedSvid.workload == workload)
    serials: list[str] = []
    for svid in session.exec(stmt).all():
        svid.revoked_at = now
        svid.revocation_reason = reason
        session.add(svid)
        serials.append(svid.serial)
    existing = session.exec(select(RevokedIdentity).where(RevokedIdentity.spiffe_id_prefix == str(prefix))).first()
    if existing is not None and not serials:  # nothing would change: no event without its change
        raise AlreadyRevoked(f"identity {prefix} was revoked at {as_utc(existing.revoked_at).isoformat()}")
    if existing is None and not serials and not _names_anything(session, tenant, group, workload):
        raise IdentityNotFound(f"nothing to revoke under {prefix}: no such {_kind(group, workload)} is registered and "
                               "no SVID was issued under it")
    if existing is None:
        session.add(RevokedIdentity(spiffe_id_prefix=str(prefix), tenant=tenant, group=group, workload=workload,
                                    reason=reason, revoked_at=now, revoked_by=f"{actor.kind}:{actor.id}"))
    record(session, actor=actor, action="identity.revoke", object_type="spiffe_id", object_id=str(prefix),
           tenant=tenant, summary={"prefix": str(prefix), "serials": sorted(serials), "count": len(serials)},
           reason=reason, at=now, request_id=request_id)
    return sorted(serials)


def _kind(group: str | None, workload: str | None) -> str:
    return "workload" if workload is not None else "group" if group is not None else "tenant"


def _names_anything(session: Session, tenant: str, group: str | None, workload: str | None) -> bool:
    """Whether the identity names something: a registered tenant, group or workload, or any SVID ever issued
    under it (revoked or not: a workload since removed from the inventory may still hold valid ones)."""
    svids = select(IssuedSvid.serial).where(IssuedSvid.tenant == tenant)
    if workload is not None:
        row: Any = select(Workload.id).where(Workload.tenant == tenant, Workload.group == group,
                                             Workload.name == workload)
        svids = svids.where(IssuedSvid.group == group, IssuedSvid.workload == workload)
    elif group is not None:
        row = select(WorkloadGroup.id).where(WorkloadGroup.tenant == tenant, WorkloadGroup.name == group)
        svids = svids.where(IssuedSvid.group == group)
    else:
        row = select(Tenant.slug).where(Tenant.slug == tenant)
    return session.exec(row.limit(1)).first() is not None or session.exec(svids.limit(1)).first() is not None


def _revoke_serial(
    session: Session, serial: str, reason: str, actor: Actor, scope_tenant: str | None, now: datetime,
    request_id: str | None,
) -> str:
    norm = _serial(serial)
    svid = session.get(IssuedSvid, norm)
    if svid is None or (scope_tenant is not None and svid.tenant != scope_tenant):
        raise SvidNotFound(f"no SVID with serial {norm}")
    if svid.revoked_at is not None:
        raise AlreadyRevoked(f"SVID {norm} was revoked at {as_utc(svid.revoked_at).isoformat()}")
    svid.revoked_at = now
    svid.revocation_reason = reason
    session.add(svid)
    record(session, actor=actor, action="svid.revoke", object_type="svid", object_id=norm, tenant=svid.tenant,
           summary={"serial": norm, "spiffe_id": svid.spiffe_id}, reason=reason, at=now,
           request_id=request_id)
    return norm


def revoked_serials(session: Session) -> list[str]:
    """Every revoked serial (hex), for CRLs and the enforcer's deny list."""
    rows = session.exec(select(IssuedSvid.serial).where(col(IssuedSvid.revoked_at).is_not(None))).all()
    return sorted(rows)


def revoked_identities(session: Session) -> list[RevokedIdentityInfo]:
    """Revoked identity prefixes (tenant, group or workload IDs) whose flows must be withdrawn."""
    rows = session.exec(select(RevokedIdentity).order_by(col(RevokedIdentity.id))).all()
    return [RevokedIdentityInfo(r.spiffe_id_prefix, r.tenant, r.group, r.workload, r.reason, as_utc(r.revoked_at))
            for r in rows]


def identity_revoked(session: Session, spiffe_id: SpiffeId, tenant: str) -> RevokedIdentity | None:
    """The revocation covering this ID, if any (on the hot issuance path: prefixes first, row only on a hit)."""
    prefixes = session.exec(
        select(RevokedIdentity.id, RevokedIdentity.spiffe_id_prefix).where(RevokedIdentity.tenant == tenant)
    ).all()
    for row_id, prefix in prefixes:
        if spiffe_id.is_under(parse_spiffe_id(prefix)):
            return session.get(RevokedIdentity, row_id)
    return None


def crls(session: Session, keystore: KeyStore, clock: Clock) -> list[x509.CertificateRevocationList]:
    """One CRL per published issuing CA (active first), signed by that CA, listing its unexpired revocations."""
    load_settings(session)
    now = clock()
    out: list[tuple[int, x509.CertificateRevocationList]] = []
    for ca in generation_cas(session, PUBLISHED_STATES):
        if ca.role != "issuing" or ca.state == "prepared":
            continue
        cert = certificate(ca)
        signer = keystore.get(ca.key_id)
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(cert.subject)
            .last_update(truncate(now))
            .next_update(truncate(now + CRL_VALIDITY))
            .add_extension(x509.CRLNumber(int(now.timestamp() * 1000)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        )
        rows = session.exec(
            select(IssuedSvid).where(IssuedSvid.issuer_ca_id == ca.id, col(IssuedSvid.revoked_at).is_not(None))
        ).all()
        for svid in rows:
            if as_utc(svid.not_after) <= now:
                continue
            revoked_at = as_utc(svid.revoked_at) if svid.revoked_at else now
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(int(svid.serial, 16))
                .revocation_date(truncate(revoked_at)).build()
            )
        crl = builder.sign(signer.private_key(), hash_for(signer.kind))  # type: ignore[arg-type]
        out.append((0 if ca.state == "active" else 1, crl))
    out.sort(key=lambda item: item[0])
    return [crl for _, crl in out]


def crl_der(session: Session, keystore: KeyStore, clock: Clock) -> bytes:
    """The active issuing CA's CRL, DER."""
    found = crls(session, keystore, clock)
    if not found:
        from pki.errors import CAUnavailable

        raise CAUnavailable("no active issuing CA to sign a CRL")
    return found[0].public_bytes(serialization.Encoding.DER)


def crl_pem(session: Session, keystore: KeyStore, clock: Clock) -> bytes:
    """The CRLs of every published issuing CA (active first), PEM, concatenated."""
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in crls(session, keystore, clock))


@dataclass(frozen=True)
class PublishedCrl:
    """The signed CRLs as served: DER of the active issuing CA's, PEM of all, each with its strong ETag."""

    der: bytes
    pem: bytes
    signed_at: datetime
    state: tuple[Any, ...]

    @staticmethod
    def etag_of(body: bytes) -> str:
        return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class CrlPublisher:
    """Signs the CRLs once per change and serves the signed bytes until the next one (issue 13, item 7:
    every GET /v1/crl used to sign a fresh CRL, a signature per unauthenticated request).

    A change is a revocation or a CA changing state (one aggregate read tells); with none, the CRLs are
    re-signed once `refresh` has passed (half their validity by default), so nextUpdate never lapses.
    One per process; thread-safe, and a request that finds a signing in progress waits for it."""

    def __init__(self, refresh: timedelta = CRL_VALIDITY / 2) -> None:
        self.refresh = refresh
        self._current: PublishedCrl | None = None
        self._lock = threading.Lock()
        self.signings = 0  # for tests and profiling

    @staticmethod
    def state(session: Session) -> tuple[Any, ...]:
        """What the CRLs are made of, in two indexed aggregate reads."""
        count, latest = session.exec(
            select(func.count(), func.max(IssuedSvid.revoked_at)).where(col(IssuedSvid.revoked_at).is_not(None))
        ).one()
        cas = session.exec(
            select(CertificateAuthority.id, CertificateAuthority.state)
            .where(col(CertificateAuthority.role) == "issuing").order_by(col(CertificateAuthority.id))
        ).all()
        return int(count), str(latest), tuple(map(tuple, cas))

    def current(self, session: Session, keystore: KeyStore, clock: Clock) -> PublishedCrl:
        """The CRLs for now: the kept ones while nothing changed and they are fresh, else newly signed."""
        state = self.state(session)
        now = clock()
        kept = self._current
        if kept is not None and kept.state == state and kept.signed_at <= now < kept.signed_at + self.refresh:
            return kept
        with self._lock:
            kept = self._current
            if kept is not None and kept.state == state and kept.signed_at <= now < kept.signed_at + self.refresh:
                return kept
            signed = crls(session, keystore, clock)
            if not signed:
                from pki.errors import CAUnavailable

                raise CAUnavailable("no active issuing CA to sign a CRL")
            self.signings += 1
            self._current = PublishedCrl(
                der=signed[0].public_bytes(serialization.Encoding.DER),
                pem=b"".join(c.public_bytes(serialization.Encoding.PEM) for c in signed),
                signed_at=now, state=state,
            )
            return self._current
