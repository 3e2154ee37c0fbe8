"""The one path every X.509 certificate for an identity takes: TTL rules, signing by the active issuing
CA, the SVID row and the audit event, all in the caller's transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from sqlmodel import Session

from audit import Actor, record
from core.clock import Clock, as_utc
from keys.store import KeyStore
from pki.ca import BACKDATE, active_issuing, certificate, extend_signed_until, truncate
from pki.errors import CAUnavailable, InvalidTTL, TTLTooLong
from pki.models import IssuedSvid
from pki.spiffe_id import SpiffeId
from pki.x509svid import LeafPublicKey, build_leaf


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
    now = clock()
    issuer = active_issuing(session, now)
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
        ip_addresses=ip_addresses,
    )
    serial_hex = format(serial, "x")
    session.add(IssuedSvid(
        serial=serial_hex, kind=kind, spiffe_id=str(spiffe_id), tenant=tenant, group=group,
        workload=workload, node=node, issuer_ca_id=issuer.id, not_before=not_before,
        not_after=not_after, created_at=now,
    ))
    extend_signed_until(issuer, not_after)
    session.add(issuer)
    record(
        session, actor=actor, action=action, object_type="svid", object_id=serial_hex, tenant=tenant,
        summary={"serial": serial_hex, "spiffe_id": str(spiffe_id), "kind": kind, "issuer": issuer.id,
                 "not_after": not_after.isoformat(), **(extra_summary or {})},
        at=now, request_id=request_id,
    )
    return IssuedX509(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        chain_pem=[issuer_cert.public_bytes(serialization.Encoding.PEM)],
        serial=serial_hex, spiffe_id=str(spiffe_id), expires_at=not_after, issuer_ca_id=issuer.id,
    )
