"""Node attestation with one-time join tokens: shown once, stored as SHA-256 only, single use even when
two nodes race with the same token (a conditional UPDATE consumes it; only one can match)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, col

from audit import Actor, record
from core.clock import Clock, as_utc
from core.errors import InvalidInput
from core.slugs import require_slug
from keys.store import KeyStore
from pki.ca import load_settings
from pki.errors import InvalidTTL, TokenInvalid, TTLTooLong
from pki.issuance import IssuedX509, issue_certificate, resolve_ttl
from pki.models import JoinToken
from pki.spiffe_id import SpiffeId, node_id
from pki.x509svid import parse_csr

DEFAULT_TOKEN_TTL = timedelta(hours=1)
MAX_TOKEN_TTL = timedelta(days=7)
TOKEN_PREFIX = "tfjt_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_join_token(
    session: Session, *, node_name: str, ttl: timedelta | None = None, actor: Actor, clock: Clock,
    request_id: str | None = None,
) -> str:
    """A new join token for `node_name`; the caller shows it once, only its hash is kept."""
    require_slug(node_name, "node name")
    load_settings(session)
    ttl = DEFAULT_TOKEN_TTL if ttl is None else ttl
    if ttl <= timedelta(0):
        raise InvalidTTL("join token TTL must be positive")
    if ttl > MAX_TOKEN_TTL:
        raise TTLTooLong(f"join token TTL is above the maximum of {int(MAX_TOKEN_TTL.total_seconds())} s")
    now = clock()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    digest = token_hash(token)
    session.add(JoinToken(token_hash=digest, node_name=node_name, created_at=now, expires_at=now + ttl,
                          created_by=f"{actor.kind}:{actor.id}"))
    record(session, actor=actor, action="node.token.create", object_type="join_token", object_id=digest,
           summary={"node": node_name, "expires_at": (now + ttl).isoformat()}, at=now,
           request_id=request_id)
    return token


def attest_node(
    session: Session, keystore: KeyStore, *, token: str, csr_pem: bytes, clock: Clock, ttl: timedelta | None = None,
    max_ttl: timedelta | None = None, request_id: str | None = None, node_name: str | None = None,
) -> IssuedX509:
    """Exchange a valid, unused join token and a CSR for spiffe://<td>/node/<name>; TokenInvalid otherwise.

    `node_name`, the node the caller says it is (the agent's --node), must be the token's: a token used on the
    wrong node is refused before it is spent, instead of issuing an SVID the caller then cannot use."""
    if not isinstance(token, str) or not token or len(token) > 256:
        raise TokenInvalid("join token is missing or malformed")
    public_key = parse_csr(csr_pem)
    settings = load_settings(session)
    now = clock()
    digest = token_hash(token)
    row = session.get(JoinToken, digest)
    if row is None:
        raise TokenInvalid("join token is unknown")
    if row.used_at is not None:
        raise TokenInvalid("join token was already used; create a new one with `trustfabric node token create`")
    if as_utc(row.expires_at) <= now:
        raise TokenInvalid("join token expired; create a new one with `trustfabric node token create`")
    if node_name is not None and node_name != row.node_name:
        raise TokenInvalid(f"join token is for node {row.node_name}, not {node_name}: use that node's token, or "
                           f"create one with `trustfabric node token create --node {node_name}`")
    consumed = session.execute(
        update(JoinToken)
        .where(col(JoinToken.token_hash) == digest, col(JoinToken.used_at).is_(None))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    if consumed.rowcount != 1:  # type: ignore[attr-defined]
        raise TokenInvalid("join token was already used")
    name = row.node_name
    ttl_resolved = resolve_ttl(ttl, default_seconds=settings.svid_default_ttl_seconds,
                               max_seconds=settings.svid_max_ttl_seconds, what="node SVID", cap=max_ttl)
    try:
        sid = node_id(settings.trust_domain, name)
    except InvalidInput:
        raise TokenInvalid("join token names an invalid node") from None
    return issue_certificate(
        session, keystore, public_key=public_key, spiffe_id=sid, ttl=ttl_resolved, kind="node",
        actor=node_actor(sid), clock=clock, action="node.attest", node=name,
        extra_summary={"join_token": digest}, request_id=request_id,
    )


def node_actor(sid: SpiffeId) -> Actor:
    """The actor of an event a node causes: its SPIFFE ID, as its requests over mTLS name it (api/principal.py) and
    SPIRE's logs do, so that filtering the log by that actor finds its attestation and renewals too."""
    return Actor(id=str(sid), kind="node")


def renew_node(
    session: Session, keystore: KeyStore, *, node_name: str, csr_pem: bytes, clock: Clock,
    max_ttl: timedelta | None = None, request_id: str | None = None,
) -> IssuedX509:
    """A new SVID for `node_name`, whose current SVID the caller proved (mTLS): the node agent renews before
    expiry with a key it generated, so the join token stays single use and nothing is dropped meanwhile."""
    public_key = parse_csr(csr_pem)
    settings = load_settings(session)
    ttl_resolved = resolve_ttl(None, default_seconds=settings.svid_default_ttl_seconds,
                               max_seconds=settings.svid_max_ttl_seconds, what="node SVID", cap=max_ttl)
    sid = node_id(settings.trust_domain, node_name)
    return issue_certificate(
        session, keystore, public_key=public_key, spiffe_id=sid, ttl=ttl_resolved, kind="node",
        actor=node_actor(sid), clock=clock, action="node.renew", node=node_name,
        request_id=request_id,
    )
