"""API tokens: the credentials of platform principals and tenant users (workloads and nodes use SVIDs).

Two kinds, one table (`api_tokens`): signed JWTs (ES256 under the `api-issuer` key in the KeyStore;
the row keyed by the `jti` makes them revocable), and opaque `tfo_` secrets (the admin bootstrap token
made by init; only their SHA-256 is stored). Minting and revoking record their audit event in the
caller's session. Checking a presented credential is the API's job (api/auth/); this module holds the
rows it checks against.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import DateTime, text
from sqlmodel import Session, col, select

from audit import Actor, record
from core.clock import Clock, as_utc, system_clock
from core.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from core.slugs import is_slug
from core.vocabulary import MINTABLE_ROLES, ROLES, TENANT_ROLES, Role
from pki.tokens.models import ApiToken
from store.db import driver_rows

if TYPE_CHECKING:
    from keys.store import KeyStore
    from store.db import Database

API_ISSUER_KEY_ID = "api-issuer"
# One indexed lookup through SQLAlchemy Core (an ORM session costs several times more per request); on
# PostgreSQL on the driver's cursor (store.db.driver_rows: half the client CPU again), whose datetimes need no
# conversion.
_ISSUED_SQL = "SELECT token_hash, role, tenant, subject, expires_at, revoked_at FROM api_tokens WHERE id = {p}"
ISSUED_ROW = text(_ISSUED_SQL.format(p=":id")).columns(
    expires_at=DateTime(timezone=True), revoked_at=DateTime(timezone=True))
_PG_ISSUED_ROW = _ISSUED_SQL.format(p="%(id)s")
# PostgreSQL: whether a token id's row lets a token with these claims in at `now` (issued here as a JWT, not revoked,
# not expired, the same role, tenant and subject), as a scalar subquery another statement may carry
# (store/carried.py): true only when every check `issued_row`'s reader makes passes; NULL without a row.
_PG_ISSUED_ROW_ADMITS = (
    "(SELECT token_hash IS NULL AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > %s) AND role = %s "
    "AND tenant IS NOT DISTINCT FROM %s AND subject = %s FROM api_tokens WHERE id = %s)")


def issued_row_admits(jti: str, *, role: str, tenant: str | None, subject: str,
                      now: datetime) -> tuple[str, tuple[Any, ...]]:
    """(PostgreSQL's scalar subquery, its parameters): true when the row of `jti` admits a JWT of these claims at
    `now` (see _PG_ISSUED_ROW_ADMITS); anything else (false, NULL) means: read the row (`issued_row`) for the
    reason."""
    return _PG_ISSUED_ROW_ADMITS, (now, role, tenant, subject, jti)


class IssuedRow(NamedTuple):
    token_hash: str | None
    role: Role  # as stored: minting accepts no other
    tenant: str | None
    subject: str
    expires_at: datetime | None
    revoked_at: datetime | None


def issued_row(db: Database, jti: str) -> IssuedRow | None:
    """The `api_tokens` row of a token id (None: not issued here), read as it is committed now: one statement
    outside any transaction (store.db's `statement`: no BEGIN or ROLLBACK around it, one round trip), so a
    revocation committed anywhere before the read is seen by it."""
    with db.statement() as conn:
        if db.dialect == "postgresql" and conn.dialect.driver == "psycopg":
            rows = driver_rows(conn, _PG_ISSUED_ROW, {"id": jti})
        else:
            rows = [tuple(r) for r in conn.execute(ISSUED_ROW, {"id": jti})]
    return IssuedRow(*rows[0]) if rows else None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def ec_public_jwk(key: ec.EllipticCurvePublicKey) -> dict[str, str]:
    numbers = key.public_numbers()
    size = (key.curve.key_size + 7) // 8
    crv = {256: "P-256", 384: "P-384", 521: "P-521"}[key.curve.key_size]
    return {
        "kty": "EC",
        "crv": crv,
        "x": _b64(numbers.x.to_bytes(size, "big")),
        "y": _b64(numbers.y.to_bytes(size, "big")),
    }


def jwk_thumbprint(jwk: dict[str, str]) -> str:
    """RFC 7638 thumbprint: the `kid` of our issuer key, stable across restarts."""
    members = {k: jwk[k] for k in ("crv", "kty", "x", "y")}
    return _b64(hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode()).digest())


def ensure_issuer_key(keystore: KeyStore) -> None:
    """Create the API issuer key once; an existing key is kept (tokens already minted stay valid)."""
    from keys.store import KeyKind

    if not keystore.exists(API_ISSUER_KEY_ID):
        keystore.generate(API_ISSUER_KEY_ID, KeyKind.EC_P256)


@dataclass(frozen=True)
class IssuerKey:
    kid: str
    public_key: ec.EllipticCurvePublicKey


def issuer_public_key(keystore: KeyStore) -> IssuerKey:
    signer = keystore.get(API_ISSUER_KEY_ID)
    public = signer.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise InvalidInput("the API issuer key must be an EC P-256 key")
    return IssuerKey(kid=jwk_thumbprint(ec_public_jwk(public)), public_key=public)


def sign_claims(keystore: KeyStore, claims: dict[str, Any], *, typ: str = "JWT") -> str:
    """A JWT over `claims` signed ES256 by the API issuer key (its `kid` in the header); the caller sets the
    audience that says what the token is for (an API token, or a console sign-in flow's state)."""
    key = issuer_public_key(keystore)
    return jwt.encode(claims, keystore.get(API_ISSUER_KEY_ID).private_key(), algorithm="ES256",
                      headers={"kid": key.kid, "typ": typ})


def verify_signed(
    keystore: KeyStore, token: str, *, audience: str, issuer: str, require: tuple[str, ...] = (),
    verify_exp: bool = True,
) -> dict[str, Any]:
    """The claims of a JWT sign_claims made for `audience` (signature, issuer, audience and, unless told
    otherwise, expiry checked; the claims named in `require` present); jwt.PyJWTError otherwise."""
    claims: dict[str, Any] = jwt.decode(
        token, issuer_public_key(keystore).public_key, algorithms=["ES256"], audience=audience, issuer=issuer,
        options={"require": list(require), "verify_exp": verify_exp},
    )
    return claims


def check_role_tenant(role: str, tenant: str | None) -> None:
    """InvalidInput unless `role` is one a token can carry, with a tenant (a DNS label) exactly when the role is
    confined to one. Reads nothing: the CLI asks it before any work, so that a wrong combination is a usage error
    there (whether the tenant exists is mint_token's to say)."""
    if role not in MINTABLE_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(MINTABLE_ROLES)}, got {role!r}")
    if role in TENANT_ROLES:
        if tenant is None:
            raise InvalidInput(f"role {role} needs --tenant")
        if not is_slug(tenant):
            raise InvalidInput(f"tenant {tenant!r} is not a DNS label")
    elif tenant is not None:
        raise InvalidInput(f"role {role} is a platform role and takes no tenant")


MAX_SOURCES = 8


def source_ids(claim: Any) -> tuple[str, ...]:
    """The token ids a `src` claim names: one id (a string) or a chain (a list, the first credential first);
    ValueError for anything else. A chain is bounded: a session opened from a session from a session..."""
    ids = [claim] if isinstance(claim, str) else claim
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_SOURCES:
        raise ValueError(f"a token stands in for 1 to {MAX_SOURCES} others")
    if not all(isinstance(i, str) and 1 <= len(i) <= 64 for i in ids):
        raise ValueError("a source token id is 1 to 64 characters")
    return tuple(ids)


def source_claim(ids: tuple[str, ...]) -> str | list[str]:
    """The `src` claim naming these ids (one: a plain string, as sessions of one credential always carried)."""
    source_ids(list(ids))
    return ids[0] if len(ids) == 1 else list(ids)


def mint_token(
    session: Session,
    keystore: KeyStore,
    *,
    role: str,
    tenant: str | None,
    ttl: timedelta,
    actor: Actor,
    issuer: str,
    audience: str,
    max_ttl: timedelta,
    subject: str | None = None,
    description: str = "",
    clock: Clock = system_clock,
    request_id: str | None = None,
    source: tuple[str, ...] = (),
) -> tuple[str, ApiToken]:
    """Sign an API token and store its jti (revocable); returns the token (shown once) and its row. `source`: the
    ids of the tokens this one stands in for (a console session: the credential signed in with, and when that was
    itself a session, every token it stood in for), carried as the `src` claim; the API refuses the token once any
    of them is revoked, expired or gone (api/auth/api_jwt.py)."""
    check_role_tenant(role, tenant)
    if tenant is not None:
        from inventory.service import get_tenant

        get_tenant(session, tenant)
    if ttl <= timedelta(0) or ttl > max_ttl:
        raise InvalidInput(f"TTL must be between 1s and {int(max_ttl.total_seconds())}s")
    if len(description) > 200:
        raise InvalidInput("description is at most 200 characters")
    # no `@` in a generated subject: the audit log and its filters write an actor as `id@tenant`, so
    # `tenant-admin@acme-1a2b3c` read as id `tenant-admin` of a tenant `acme-1a2b3c` (and printed `...@acme`)
    subject = subject or f"{role}-{secrets.token_hex(3)}"
    if len(subject) > 256:
        raise InvalidInput("subject is at most 256 characters")
    now = clock().replace(microsecond=0)
    jti = secrets.token_hex(16)
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "sub": subject,
        "jti": jti,
        "iat": int(now.timestamp()),
        "nbf": int(now.timestamp()),
        "exp": int((now + ttl).timestamp()),
        "role": role,
    }
    if tenant is not None:
        claims["tenant"] = tenant
    if source:
        try:
            claims["src"] = source_claim(source)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    token = sign_claims(keystore, claims)
    row = ApiToken(
        id=jti, token_hash=None, role=role, tenant=tenant, subject=subject, description=description,
        created_at=now, expires_at=now + ttl,
    )
    session.add(row)
    session.flush()
    record(
        session, actor=actor, action="token.create", object_type="api_token", object_id=jti, tenant=tenant,
        summary={"role": role, "subject": subject, "kind": "jwt", "expires_at": (now + ttl).isoformat()},
        at=now, request_id=request_id,
    )
    return token, row


def require_token(session: Session, token_id: str) -> ApiToken:
    """The token's row (never its secret: only hashes are stored), or NotFound."""
    row = get_token(session, token_id)
    if row is None:
        raise NotFound(f"token {token_id!r} not found")
    return row


def revoke_token(
    session: Session, token_id: str, *, actor: Actor, reason: str, clock: Clock = system_clock
) -> ApiToken:
    row = require_token(session, token_id)
    if row.revoked_at is not None:
        raise Conflict(f"token {token_id!r} is already revoked")
    row.revoked_at = clock()
    session.add(row)
    session.flush()
    record(
        session, actor=actor, action="token.revoke", object_type="api_token", object_id=token_id,
        tenant=row.tenant, summary={"role": row.role, "subject": row.subject}, reason=reason or None,
    )
    return row


def get_token(session: Session, token_id: str) -> ApiToken | None:
    """The row of a token by its id (a JWT's jti), or None."""
    return session.get(ApiToken, token_id) if len(token_id) <= 64 else None


def list_tokens(session: Session, *, after: str | None, limit: int) -> list[ApiToken]:
    """Tokens ordered by id, after the cursor `after`; never the secrets (only hashes are stored)."""
    query = select(ApiToken).order_by(col(ApiToken.id)).limit(limit)
    if after is not None:
        query = query.where(col(ApiToken.id) > after)
    return list(session.exec(query).all())


# ---- opaque tokens

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


def recover_bootstrap_token(
    session: Session, *, actor: Actor, ttl: timedelta, clock: Clock = system_clock
) -> tuple[str, list[str]]:
    """A new bootstrap admin token for the operator on the host (whoever can open the data directory and
    the key store): every opaque admin token still unrevoked is revoked, a fresh one (expiring after `ttl`)
    made; (the secret, the ids revoked). Each step is audited in the caller's transaction."""
    now = clock()
    old = session.exec(
        select(ApiToken).where(ApiToken.role == "admin", col(ApiToken.token_hash).is_not(None),
                               col(ApiToken.revoked_at).is_(None))
    ).all()
    for row in old:
        revoke_token(session, row.id, actor=actor, reason="replaced by token recover", clock=clock)
    secret = create_opaque_token(session, role="admin", subject="admin", actor=actor, ttl=ttl, clock=clock,
                                 description=f"bootstrap admin token made by token recover at {now.isoformat()}")
    return secret, [row.id for row in old]


def opaque_token(session: Session, secret: str, clock: Clock = system_clock) -> ApiToken:
    """The live row of an opaque token, or Unauthenticated (unknown, revoked, expired)."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 256:
        raise Unauthenticated("invalid bearer token")
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == _hash(secret))).first()
    if row is None or row.token_hash is None or not hmac.compare_digest(row.token_hash, _hash(secret)):
        raise Unauthenticated("invalid bearer token")
    if row.revoked_at is not None:
        raise Unauthenticated("token revoked")
    if row.expires_at is not None and as_utc(row.expires_at) <= clock():
        raise Unauthenticated("token expired")
    return row
