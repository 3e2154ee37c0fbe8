"""PKI façade: the functions api/ calls. Each takes the session (one transaction: the change and its
audit event commit together or not at all), the key store and the clock explicitly."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from sqlalchemy import and_, bindparam, exists
from sqlmodel import Session, col, select

from audit import Actor, record
from core.clock import Clock, as_utc, system_clock
from core.errors import InvalidInput, TrustfabricError
from core.slugs import require_slug
from inventory.models import Placement, Tenant, Workload, WorkloadGroup
from inventory.service import raise_if_quarantined
from keys.store import KeyKind, KeyStore
from pki import attestation, registrations, revocation, rotation
from pki.bundle import bundle_document, bundle_roots_pem
from pki.ca import (
    GenerationKeys,
    active_issuing,
    create_generation,
    extend_signed_until,
    load_settings,
    publish_until,
    truncate,
)
from pki.errors import (
    CAUnavailable,
    IdentityOutOfScope,
    IdentityRevoked,
    InvalidSpiffeId,
    IssuerChanged,
    NotPlacedOnNode,
    SvidNotFound,
    TokenInvalid,
    TrustDomainMismatch,
    UnknownWorkload,
)
from pki.issuance import (
    IssuedJWT,
    IssuedX509,
    issue_certificate,
    record_issued,
    resolve_ttl,
    sign_leaf,
    signing_issuer,
)
from pki.jwtsvid import check_audience, mint
from pki.models import CertificateAuthority, RevokedIdentity, TrustDomainSettings
from pki.revocation import RevokedIdentityInfo
from pki.rotation import RotationStatus
from pki.schedule import status_dict as status_dict
from pki.spiffe_id import (
    SpiffeId,
    node_id,
    parse_spiffe_id,
    server_id,
    tenant_namespace,
    validate_trust_domain,
)
from pki.x509svid import leaf_subject, parse_csr
from store.db import Database
from store.groupcommit import Check, GroupCommitter

__all__ = [
    "DEFAULT_CA_TTL", "DEFAULT_JWT_TTL", "DEFAULT_SVID_TTL", "MAX_JWT_TTL", "MAX_SVID_TTL", "IssuedJWT",
    "IssuedX509", "RevokedIdentityInfo", "RotationStatus", "X509Ask", "attest_node", "bundle_jwks", "bundle_pem",
    "ca_status", "create_join_token", "crl_der", "crl_pem", "init_trust_domain", "issue_jwt_svid",
    "issue_server_svid", "issue_x509_svid", "issue_x509_svid_grouped", "issue_x509_svids_grouped", "revoke",
    "revoked_identities", "revoked_serials", "rotate", "trust_domain",
]

DEFAULT_CA_TTL = timedelta(days=7)
DEFAULT_SVID_TTL = timedelta(hours=1)
MAX_SVID_TTL = timedelta(hours=24)
DEFAULT_JWT_TTL = timedelta(minutes=5)
MAX_JWT_TTL = timedelta(hours=1)


def init_trust_domain(
    session: Session,
    keystore: KeyStore,
    *,
    trust_domain: str,
    key_kind: KeyKind = KeyKind.EC_P256,
    clock: Clock = system_clock,
    ca_ttl: timedelta = DEFAULT_CA_TTL,
    svid_max_ttl: timedelta = MAX_SVID_TTL,
    jwt_max_ttl: timedelta = MAX_JWT_TTL,
    actor: Actor | None = None,
    reserved: GenerationKeys | None = None,
) -> bool:
    """Create the trust domain with its first root + issuing CA; True if created, False if it existed
    (a different trust domain is TrustDomainMismatch: a trust domain is never renamed in place). `reserved`: the
    first generation's key ids, their intents committed before this transaction (pki.ca.reserve_generation_keys)."""
    validate_trust_domain(trust_domain)
    key_kind = KeyKind(key_kind)
    if key_kind is KeyKind.ED25519:
        raise InvalidInput("CA keys are ECDSA P-256 (default) or P-384; Ed25519 is not accepted by TLS stacks")
    existing = session.get(TrustDomainSettings, 1)
    if existing is not None:
        if existing.trust_domain != trust_domain:
            raise TrustDomainMismatch(
                f"trust domain {existing.trust_domain!r} exists already; it cannot become {trust_domain!r}"
            )
        return False
    if ca_ttl < timedelta(hours=1):
        raise InvalidInput("CA TTL must be at least 1 hour")
    if svid_max_ttl <= timedelta(0) or svid_max_ttl > ca_ttl / 2:
        raise InvalidInput("the SVID max TTL must be positive and at most half the CA TTL")
    if jwt_max_ttl <= timedelta(0) or jwt_max_ttl > ca_ttl / 2:
        raise InvalidInput("the JWT-SVID max TTL must be positive and at most half the CA TTL")
    now = clock()
    settings = TrustDomainSettings(
        id=1, trust_domain=trust_domain, key_kind=key_kind.value,
        ca_ttl_seconds=int(ca_ttl.total_seconds()),
        svid_default_ttl_seconds=int(min(DEFAULT_SVID_TTL, svid_max_ttl).total_seconds()),
        svid_max_ttl_seconds=int(svid_max_ttl.total_seconds()),
        jwt_default_ttl_seconds=int(min(DEFAULT_JWT_TTL, jwt_max_ttl).total_seconds()),
        jwt_max_ttl_seconds=int(jwt_max_ttl.total_seconds()),
        bundle_sequence=1, created_at=now,
    )
    session.add(settings)
    session.flush()
    _root, issuing = create_generation(session, keystore, settings, state="active", now=now, reserved=reserved)
    record(session, actor=actor or Actor.system(), action="ca.init", object_type="trust_domain",
           object_id=trust_domain, summary={
               "trust_domain": trust_domain, "key_kind": key_kind.value, "generation": issuing.generation,
               "not_after": as_utc(issuing.not_after).isoformat()}, at=now)
    return True


def trust_domain(session: Session) -> str | None:
    """The trust domain name, or None before init."""
    row = session.get(TrustDomainSettings, 1)
    return row.trust_domain if row else None


def _registered_identity(
    session: Session, *, tenant: str, group: str, workload: str, scope_tenant: str | None, on_node: str | None = None
) -> tuple[TrustDomainSettings, SpiffeId]:
    """The registered workload's SPIFFE ID, after scope, placement (a node's request), registration and
    revocation checks. A node learns nothing about a workload not placed on it: the placement check comes
    before the registration lookup, so an unknown workload and another node's workload answer alike."""
    require_slug(tenant, "tenant")
    require_slug(group, "group")
    if not isinstance(workload, str) or not workload or len(workload) > 63:
        raise InvalidInput("workload must be a name of 1-63 characters")
    if on_node is not None:
        placed = session.get(Placement, f"{tenant}/{group}/{workload}")
        if placed is None or placed.node != on_node:
            raise NotPlacedOnNode(f"out-of-scope: node {on_node} obtains identities only for the workloads placed "
                                  f"on it, and {tenant}/{group}/{workload} is not one of them")
    if scope_tenant is not None and tenant != scope_tenant:
        raise IdentityOutOfScope(
            f"tenant {scope_tenant!r} may only obtain identities under /tenant/{scope_tenant}/, "
            f"not under /tenant/{tenant}/"
        )
    settings = load_settings(session)
    # one statement on the hot issuance path: the workload, its tenant's and group's quarantine, and whether
    # any identity of the tenant was ever revoked (the prefixes are read only then)
    row = session.connection().execute(_REGISTRATION, {"t": tenant, "g": group, "w": workload}).first()
    if row is None:
        raise UnknownWorkload(f"workload {tenant}/{group}/{workload} is not registered; register it first")
    spiffe_id, revoked, tenant_quarantined, group_quarantined, any_revoked = row
    raise_if_quarantined(tenant, group, bool(tenant_quarantined), bool(group_quarantined))
    try:
        sid = parse_spiffe_id(spiffe_id)
    except InvalidSpiffeId as exc:
        raise CAUnavailable(f"registered SPIFFE ID of {tenant}/{group}/{workload} is invalid: {exc}") from None
    namespace = tenant_namespace(settings.trust_domain, tenant)
    if sid.trust_domain != settings.trust_domain or not sid.is_under(namespace) or sid == namespace:
        raise IdentityOutOfScope(f"registered ID {spiffe_id} lies outside {namespace}/")
    if scope_tenant is not None and not sid.is_under(tenant_namespace(settings.trust_domain, scope_tenant)):
        raise IdentityOutOfScope(f"{sid} lies outside /tenant/{scope_tenant}/")
    if revoked:
        raise IdentityRevoked(f"identity {sid} was revoked; no SVIDs are issued to it")
    hit = revocation.identity_revoked(session, sid, tenant) if any_revoked else None
    if hit is not None:
        raise IdentityRevoked(f"identity {sid} was revoked ({hit.spiffe_id_prefix}: {hit.reason})")
    return settings, sid


_REGISTRATION = (
    select(  # type: ignore[call-overload]
        col(Workload.spiffe_id), col(Workload.revoked), col(Tenant.quarantined), col(WorkloadGroup.quarantined),
        exists().where(col(RevokedIdentity.tenant) == col(Workload.tenant)),
    )
    .select_from(Workload)
    .outerjoin(Tenant, col(Tenant.slug) == col(Workload.tenant))
    .outerjoin(WorkloadGroup, and_(col(WorkloadGroup.tenant) == col(Workload.tenant),
                                   col(WorkloadGroup.name) == col(Workload.group)))
    .where(col(Workload.tenant) == bindparam("t"), col(Workload.group) == bindparam("g"),
           col(Workload.name) == bindparam("w"))
)


def issue_x509_svid(
    session: Session,
    keystore: KeyStore,
    *,
    csr_pem: bytes,
    tenant: str,
    group: str,
    workload: str,
    ttl: timedelta | None,
    actor: Actor,
    scope_tenant: str | None,
    clock: Clock = system_clock,
    max_ttl: timedelta | None = None,
    request_id: str | None = None,
    on_node: str | None = None,
) -> IssuedX509:
    """An X.509-SVID for a registered workload; only the CSR's (signature-checked) public key is used.
    `max_ttl` tightens the trust domain's maximum (deployment setting); `on_node` (a node's request) confines
    it to the workloads placed on that node (NotPlacedOnNode)."""
    public_key = parse_csr(csr_pem)
    settings, sid = _registered_identity(
        session, tenant=tenant, group=group, workload=workload, scope_tenant=scope_tenant, on_node=on_node
    )
    ttl_resolved = resolve_ttl(ttl, default_seconds=settings.svid_default_ttl_seconds,
                               max_seconds=settings.svid_max_ttl_seconds, what="X.509-SVID", cap=max_ttl)
    return issue_certificate(
        session, keystore, public_key=public_key, spiffe_id=sid, ttl=ttl_resolved, kind="workload",
        actor=actor, clock=clock, action="svid.issue", tenant=tenant, group=group, workload=workload,
        request_id=request_id,
    )


def issue_x509_svid_grouped(
    db: Database,
    committer: GroupCommitter,
    keystore: KeyStore,
    *,
    csr_pem: bytes,
    tenant: str,
    group: str,
    workload: str,
    ttl: timedelta | None,
    actor: Actor,
    scope_tenant: str | None,
    clock: Clock = system_clock,
    max_ttl: timedelta | None = None,
    request_id: str | None = None,
    on_node: str | None = None,
) -> IssuedX509:
    """issue_x509_svid, with the CSR checked and the certificate signed outside any write transaction and the
    SVID row and its audit event group-committed (store/groupcommit.py) with other writes. Returned only
    once committed. The registration is checked in the committing transaction, under the audit head lock
    that every change to a registration also takes: a workload revoked, unregistered or quarantined after the
    signature gets nothing (the signed certificate is dropped, never shown). The check's reads are kept per
    process while the audit log shows no change that could alter them (pki/registrations.py).

    What signing needs (the SPIFFE ID, the TTL rules, the active CA) is kept per process from the last
    issuance to the same identity: the committing transaction's check is authoritative, and a certificate
    signed from facts that changed meanwhile (its CA rotated out, the TTL rules changed) is refused there and
    signed again from fresh facts, once."""
    ask = X509Ask(csr_pem=csr_pem, tenant=tenant, group=group, workload=workload, ttl=ttl)
    grouped = _Grouped(db, keystore, ask, actor=actor, scope_tenant=scope_tenant, clock=clock, max_ttl=max_ttl,
                       request_id=request_id, on_node=on_node)
    try:
        return committer.submit(*grouped.prepare(fresh=False), savepoint=False, late=True)
    except (IssuerChanged, StaleFacts):  # a rotation or a registration change meanwhile: once more, afresh
        _facts.drop(grouped.key)
        return committer.submit(*grouped.prepare(fresh=True), savepoint=False, late=True)
    except TrustfabricError:
        _facts.drop(grouped.key)  # refused (revoked, unknown, quarantined): read afresh next time
        raise


@dataclass(frozen=True)
class X509Ask:
    """One X.509-SVID asked for: a workload's CSR (PEM) and the lifetime wished (None: the default)."""

    csr_pem: bytes
    tenant: str
    group: str
    workload: str
    ttl: timedelta | None = None


def issue_x509_svids_grouped(
    db: Database,
    committer: GroupCommitter,
    keystore: KeyStore,
    asks: Sequence[X509Ask],
    *,
    actor: Actor,
    scope_tenant: str | None,
    clock: Clock = system_clock,
    max_ttl: timedelta | None = None,
    request_id: str | None = None,
    on_node: str | None = None,
) -> list[IssuedX509 | TrustfabricError]:
    """issue_x509_svid_grouped for each of `asks` (SPIRE's BatchNewX509SVID), answered per ask in their order: its
    SVID, or the domain error it was refused with (a bad CSR, an unknown or unplaced workload, a revoked or
    quarantined identity, a TTL above the maximum). Each is checked and signed as there, the facts read in one read
    session for those not kept; then all are handed to the group committer at once (one commit for the lot, when
    nothing else is queued before them) and each SVID row and its audit event are durable when this returns. A
    refused ask writes nothing and changes nothing for the others. Any other error (the database's) is raised, as
    for one issuance: asks committed before it keep their rows and events (like a single answer lost in transit)."""
    outcomes: list[IssuedX509 | TrustfabricError | None] = [None] * len(asks)
    grouped: dict[int, _Grouped] = {}
    submitted: dict[int, tuple[Callable[[Session], IssuedX509], Check]] = {}
    shared: Session | None = None
    with ExitStack() as stack:
        def read_session() -> Session:  # opened once, for the first ask whose facts are not kept
            nonlocal shared
            if shared is None:
                shared = stack.enter_context(db.read_session())
            return shared

        for index, ask in enumerate(asks):  # the facts first, in the one read session
            try:
                grouped[index] = _Grouped(db, keystore, ask, actor=actor, scope_tenant=scope_tenant, clock=clock,
                                          max_ttl=max_ttl, request_id=request_id, on_node=on_node)
                grouped[index].load_facts(read_session)
            except TrustfabricError as exc:
                if index in grouped:
                    _facts.drop(grouped.pop(index).key)
                outcomes[index] = exc
    for index in sorted(grouped):  # then signed, the read session's connection given back (publish_until takes one)
        try:
            submitted[index] = grouped[index].prepare(fresh=False)
        except TrustfabricError as exc:
            _facts.drop(grouped[index].key)
            outcomes[index] = exc
    for fresh in (False, True):
        order = sorted(submitted)
        answers = committer.submit_many([submitted[i] for i in order], savepoint=False, late=True)
        submitted = {}
        failure: Exception | None = None
        for index, answer in zip(order, answers, strict=True):
            if isinstance(answer, IssuedX509):
                outcomes[index] = answer
            elif isinstance(answer, IssuerChanged) and not fresh:  # (StaleFacts too): once more, afresh
                _facts.drop(grouped[index].key)
                try:
                    submitted[index] = grouped[index].prepare(fresh=True)
                except TrustfabricError as exc:
                    outcomes[index] = exc
            elif isinstance(answer, TrustfabricError):
                _facts.drop(grouped[index].key)  # refused: read afresh next time
                outcomes[index] = answer
            else:
                failure = failure or answer
        if failure is not None:
            raise failure
        if not submitted:
            break
    return [outcome if outcome is not None else IssuerChanged("signed again and refused again: retry")
            for outcome in outcomes]


class _Grouped:
    """One group-committed X.509-SVID issuance: the CSR checked now, then (`prepare`) signed from the facts kept
    for its identity (or read afresh) and made into the committer's (write, check)."""

    def __init__(self, db: Database, keystore: KeyStore, ask: X509Ask, *, actor: Actor, scope_tenant: str | None,
                 clock: Clock, max_ttl: timedelta | None, request_id: str | None, on_node: str | None) -> None:
        self.public_key = parse_csr(ask.csr_pem)
        self.key = (db.url, ask.tenant, ask.group, ask.workload, scope_tenant, on_node)
        self.db, self.keystore, self.ask, self.actor, self.scope_tenant = db, keystore, ask, actor, scope_tenant
        self.clock, self.max_ttl, self.request_id, self.on_node = clock, max_ttl, request_id, on_node
        self.facts: _Facts | None = None  # load_facts's, for the first prepare

    def load_facts(self, read: Callable[[], Session]) -> None:
        """The identity's facts for the first `prepare`: kept ones, else read in `read()`'s session."""
        facts = _facts.get(self.key, self.clock())
        if facts is None:
            facts = self._read_facts(read())
            _facts.put(self.key, facts)
        self.facts = facts

    def _read_facts(self, session: Session) -> _Facts:
        a = self.ask
        settings, sid = _registered_identity(session, tenant=a.tenant, group=a.group, workload=a.workload,
                                             scope_tenant=self.scope_tenant, on_node=self.on_node)
        issuer = active_issuing(session, self.clock(), lock=False)
        return _Facts(sid, settings.svid_default_ttl_seconds, settings.svid_max_ttl_seconds, issuer,
                      leaf_subject(sid))

    def prepare(self, *, fresh: bool) -> tuple[Callable[[Session], IssuedX509], Check]:
        """Signed, the CA's signed_until raised; (write, check) for the committer. Not `fresh`: from the facts
        load_facts found, else kept ones; else (or `fresh`) read in a read session of its own."""
        db, a, clock, ttl, max_ttl = self.db, self.ask, self.clock, self.ask.ttl, self.max_ttl
        tenant, group, workload, scope_tenant, on_node = a.tenant, a.group, a.workload, self.scope_tenant, self.on_node
        facts = None if fresh else (self.facts or _facts.get(self.key, clock()))
        self.facts = None  # used once: a retry reads afresh
        if facts is None:
            with db.read_session() as session:
                facts = self._read_facts(session)
            _facts.put(self.key, facts)
        ttl_resolved = resolve_ttl(ttl, default_seconds=facts.default_ttl, max_seconds=facts.max_ttl,
                                   what="X.509-SVID", cap=max_ttl)
        signed = sign_leaf(None, self.keystore, public_key=self.public_key, spiffe_id=facts.sid, ttl=ttl_resolved,
                           clock=clock, issuer=facts.issuer, subject=facts.subject)
        publish_until(db, facts.issuer, signed.not_after)  # before the batch: never the CA row under the head
        key = self.key

        def check(session: Session) -> None:
            def read_registration() -> registrations.Registered:
                settings, sid = _registered_identity(
                    session, tenant=tenant, group=group, workload=workload, scope_tenant=scope_tenant,
                    on_node=on_node)
                return registrations.Registered(sid, settings.svid_default_ttl_seconds, settings.svid_max_ttl_seconds)

            found = registrations.lookup(db, session, key, read_registration)
            current = resolve_ttl(ttl, default_seconds=found.default_ttl, max_seconds=found.max_ttl,
                                  what="X.509-SVID", cap=max_ttl)
            if found.sid != signed.spiffe_id or current != ttl_resolved:
                raise StaleFacts(f"the registration of {tenant}/{group}/{workload} changed while signing")
            signing_issuer(session, signed)

        actor, request_id = self.actor, self.request_id

        def write(session: Session) -> IssuedX509:
            return record_issued(session, signed, kind="workload", actor=actor, action="svid.issue",
                                 tenant=tenant, group=group, workload=workload, request_id=request_id,
                                 published=True)

        # record_issued only writes (its refusals are the check's): no savepoint needed around it. Both run under the
        # audit head's lock whether or not they join late, and lock no row (they read and insert; the CA's
        # signed_until was raised before), so joining a batch that holds it changes no lock order
        return write, check


class StaleFacts(IssuerChanged):
    """What a certificate was signed from changed before it was recorded: it is dropped and signed again."""


@dataclass(frozen=True)
class _Facts:
    sid: SpiffeId
    default_ttl: int
    max_ttl: int
    issuer: CertificateAuthority
    subject: x509.Name  # the leaf's (pki.x509svid.leaf_subject): the same for every SVID of the identity


class _FactsCache:
    """(database, tenant, group, workload, scope) -> what signing needs; bounded, least recently used out."""

    SIZE = 65_536

    def __init__(self) -> None:
        self._entries: OrderedDict[Any, _Facts] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, now: datetime) -> _Facts | None:
        with self._lock:
            facts = self._entries.get(key)
            if facts is None:
                return None
            if as_utc(facts.issuer.not_after) <= now:  # its CA can no longer sign
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return facts

    def put(self, key: Any, facts: _Facts) -> None:
        with self._lock:
            self._entries[key] = facts
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)

    def drop(self, key: Any) -> None:
        with self._lock:
            self._entries.pop(key, None)


_facts = _FactsCache()


def issue_jwt_svid(
    session: Session,
    keystore: KeyStore,
    *,
    tenant: str,
    group: str,
    workload: str,
    audience: list[str],
    ttl: timedelta | None,
    actor: Actor,
    scope_tenant: str | None,
    clock: Clock = system_clock,
    request_id: str | None = None,
    on_node: str | None = None,
) -> IssuedJWT:
    """A JWT-SVID (ES256, kid, sub, aud, exp, iat) signed by the active generation's JWT key; `on_node` as for
    issue_x509_svid."""
    audience = check_audience(audience)
    settings, sid = _registered_identity(
        session, tenant=tenant, group=group, workload=workload, scope_tenant=scope_tenant, on_node=on_node
    )
    ttl_resolved = resolve_ttl(ttl, default_seconds=settings.jwt_default_ttl_seconds,
                               max_seconds=settings.jwt_max_ttl_seconds, what="JWT-SVID")
    now = clock()
    issuer = active_issuing(session, now)
    issued_at = truncate(now)
    expires_at = min(truncate(now + ttl_resolved), as_utc(issuer.not_after))
    if expires_at <= now or issuer.jwt_key_id is None or issuer.jwt_kid is None:
        raise CAUnavailable(f"issuing CA {issuer.id} cannot sign JWT-SVIDs now; run `trustfabric ca rotate`")
    token = mint(keystore.get(issuer.jwt_key_id), kid=issuer.jwt_kid, spiffe_id=sid, audience=audience,
                 issued_at=issued_at, expires_at=expires_at)
    extend_signed_until(issuer, expires_at)
    session.add(issuer)
    record(session, actor=actor, action="svid.jwt.issue", object_type="jwt_svid", object_id=str(sid),
           tenant=tenant, summary={"spiffe_id": str(sid), "audience": audience, "kid": issuer.jwt_kid,
                                   "exp": expires_at.isoformat()}, at=now, request_id=request_id)
    return IssuedJWT(token=token, spiffe_id=str(sid), audience=audience, expires_at=expires_at,
                     kid=issuer.jwt_kid, issued_at=issued_at)


def issue_server_svid(
    session: Session,
    keystore: KeyStore,
    *,
    csr_pem: bytes,
    dns_names: tuple[str, ...] = ("localhost",),
    ip_addresses: tuple[str, ...] = ("127.0.0.1",),
    ttl: timedelta | None = None,
    actor: Actor | None = None,
    clock: Clock = system_clock,
) -> IssuedX509:
    """The API server's own TLS certificate: spiffe://<td>/trustfabric/server plus DNS/IP SANs."""
    public_key = parse_csr(csr_pem)
    settings = load_settings(session)
    ttl_resolved = resolve_ttl(ttl, default_seconds=settings.svid_max_ttl_seconds,
                               max_seconds=settings.svid_max_ttl_seconds, what="server SVID")
    return issue_certificate(
        session, keystore, public_key=public_key, spiffe_id=server_id(settings.trust_domain),
        ttl=ttl_resolved, kind="server", actor=actor or Actor.system(), clock=clock, action="svid.issue",
        dns_names=dns_names, ip_addresses=ip_addresses,
    )


def bundle_jwks(session: Session, clock: Clock = system_clock) -> dict[str, Any]:
    """The SPIFFE bundle (JWKS): x509-svid roots and jwt-svid keys of every published generation."""
    return bundle_document(session)


def bundle_pem(session: Session, clock: Clock = system_clock) -> bytes:
    """The X.509 trust anchors (published roots) as PEM."""
    return bundle_roots_pem(session)


def rotate(
    session: Session, keystore: KeyStore, *, force: bool, actor: Actor, clock: Clock = system_clock,
    request_id: str | None = None, reserved: GenerationKeys | None = None,
) -> RotationStatus:
    """Advance the CA schedule (prepare at 1/2 life, activate at 1/6 before expiry, retire when drained). A server's
    callers go through workflows/rotation.py, which reserves the key ids of a generation it prepares first."""
    return rotation.rotate(session, keystore, force=force, actor=actor, clock=clock, request_id=request_id,
                           reserved=reserved)


def ca_status(session: Session, clock: Clock = system_clock) -> RotationStatus:
    """The CA generations and the next scheduled steps; read-only."""
    return rotation.ca_status(session, clock)


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
    clock: Clock = system_clock,
    request_id: str | None = None,
) -> list[str]:
    """Revoke one SVID by serial, or an identity (tenant[/group[/workload]]) and all its SVIDs."""
    return revocation.revoke(session, serial=serial, tenant=tenant, group=group, workload=workload,
                             reason=reason, actor=actor, scope_tenant=scope_tenant, clock=clock,
                             request_id=request_id)


def crl_der(session: Session, keystore: KeyStore, clock: Clock = system_clock) -> bytes:
    """The active issuing CA's CRL (DER)."""
    return revocation.crl_der(session, keystore, clock)


def crl_pem(session: Session, keystore: KeyStore, clock: Clock = system_clock) -> bytes:
    """CRLs of all published issuing CAs (PEM)."""
    return revocation.crl_pem(session, keystore, clock)


def revoked_serials(session: Session) -> list[str]:
    """Revoked serials (hex) for deny lists."""
    return revocation.revoked_serials(session)


def revoked_identities(session: Session) -> list[RevokedIdentityInfo]:
    """Revoked identity prefixes: the enforcer withdraws their flows."""
    return revocation.revoked_identities(session)


def create_join_token(
    session: Session, *, node_name: str, ttl: timedelta | None = None, actor: Actor, clock: Clock = system_clock,
    request_id: str | None = None,
) -> str:
    """A one-time node join token (returned once; stored hashed)."""
    return attestation.create_join_token(session, node_name=node_name, ttl=ttl, actor=actor, clock=clock,
                                         request_id=request_id)


def attest_node(
    session: Session, keystore: KeyStore, *, token: str, csr_pem: bytes, clock: Clock = system_clock,
    max_ttl: timedelta | None = None, request_id: str | None = None, node_name: str | None = None,
) -> IssuedX509:
    """Exchange a join token and a CSR for the node's SVID spiffe://<td>/node/<name> (`node_name`: the node the
    caller says it is, which must be the token's)."""
    return attestation.attest_node(session, keystore, token=token, csr_pem=csr_pem, clock=clock, max_ttl=max_ttl,
                                   request_id=request_id, node_name=node_name)


def renew_node(
    session: Session, keystore: KeyStore, *, node_name: str, csr_pem: bytes, clock: Clock = system_clock,
    max_ttl: timedelta | None = None, request_id: str | None = None,
) -> IssuedX509:
    """A fresh SVID for a node that proves its current one (mTLS), for the CSR's new key."""
    return attestation.renew_node(session, keystore, node_name=node_name, csr_pem=csr_pem, clock=clock,
                                  max_ttl=max_ttl, request_id=request_id)


def svid_tenant(session: Session, serial: str) -> str | None:
    """The tenant of the SVID with this serial (hex, any case, optional 0x and colons); SvidNotFound."""
    from pki.models import IssuedSvid

    norm = serial.strip().lower().removeprefix("0x").replace(":", "").lstrip("0") or "0"
    row = session.get(IssuedSvid, norm)
    if row is None:
        raise SvidNotFound(f"no SVID with serial {norm}")
    return row.tenant


def join_token_expires_at(session: Session, token: str) -> datetime:
    """When a join token this session created expires."""
    from pki.attestation import token_hash
    from pki.models import JoinToken

    row = session.get(JoinToken, token_hash(token))
    if row is None:
        raise TokenInvalid("join token not found")
    return as_utc(row.expires_at)


def node_spiffe_id(session: Session, node_name: str) -> str:
    """spiffe://<td>/node/<name> in this trust domain (NotInitialized before init)."""
    return str(node_id(load_settings(session).trust_domain, node_name))


@dataclass(frozen=True)
class SvidValidity:
    """The SVIDs of one kind that are valid now: how many, and when the first and the last of them expire."""

    kind: str
    valid: int
    first_expiry: datetime | None
    last_expiry: datetime | None


def svid_validity(session: Session, now: datetime) -> list[SvidValidity]:
    """Per kind (workload, node, server), the unrevoked X.509-SVIDs not yet expired at `now`: for metrics."""
    from sqlalchemy import func

    from pki.models import IssuedSvid

    rows = session.exec(
        select(IssuedSvid.kind, func.count(), func.min(IssuedSvid.not_after), func.max(IssuedSvid.not_after))
        .where(IssuedSvid.revoked_at == None, IssuedSvid.not_after > now)  # noqa: E711
        .group_by(IssuedSvid.kind)
    ).all()
    return [SvidValidity(str(kind), int(n), as_utc(first) if first else None, as_utc(last) if last else None)
            for kind, n, first, last in rows]
