"""Opaque bearer tokens (the admin bootstrap token made by `init`): random secret, only its hash stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlmodel import Session, select

from api.models import ApiToken
from api.principal import ROLES, Principal
from audit import Actor, record
from core.clock import Clock, as_utc, system_clock
from core.errors import Unauthenticated

TOKEN_PREFIX = "tfo_"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_opaque_token(
    session: Session,
    *,
    role: str,
    subject: str,
    actor: Actor,
    tenant: str | None = None,
    ttl: timedelta | None = None,
    description: str = "",
    clock: Clock = system_clock,
) -> str:
    """Returns the secret once; the database keeps only its SHA-256."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    token_id = secrets.token_hex(8)
    secret = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    now = clock()
    session.add(
        ApiToken(
            id=token_id, token_hash=_hash(secret), role=role, tenant=tenant, subject=subject,
            description=description, created_at=now, expires_at=now + ttl if ttl else None,
        )
    )
    session.flush()
    record(
        session, actor=actor, action="token.create", object_type="api_token", object_id=token_id,
        tenant=tenant, summary={"role": role, "subject": subject, "kind": "opaque"},
    )
    return secret


def has_admin_token(session: Session) -> bool:
    return session.exec(
        select(ApiToken).where(ApiToken.role == "admin", ApiToken.token_hash != None)  # noqa: E711
    ).first() is not None


def authenticate_opaque(session: Session, secret: str, clock: Clock = system_clock) -> Principal:
    """The principal for an opaque token, or Unauthenticated (unknown, revoked, expired)."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 256:
        raise Unauthenticated("invalid bearer token")
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == _hash(secret))).first()
    if row is None or row.token_hash is None or not hmac.compare_digest(row.token_hash, _hash(secret)):
        raise Unauthenticated("invalid bearer token")
    if row.revoked_at is not None:
        raise Unauthenticated("token revoked")
    if row.expires_at is not None and as_utc(row.expires_at) <= clock():
        raise Unauthenticated("token expired")
    return Principal(id=row.subject, role=row.role, tenant=row.tenant, auth="token")  # type: ignore[arg-type]
