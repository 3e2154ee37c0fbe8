"""JWT bearer authentication: our own API tokens (ES256, issuer key in the KeyStore, revocable by jti),
an optional external OIDC issuer (JWKS file or URL), and JWT-SVIDs with audience `trustfabric-api`.

Every check fails closed with Unauthenticated (HTTP 401) and nothing is written. The verifier pins the
algorithm per issuer (ES256 for ours and for JWT-SVIDs; the JWKS key's own for OIDC), so `alg: none` and
HS256-with-the-public-key-as-secret never reach a signature check. Times are checked against the
injectable clock, with no leeway.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import Request
from sqlalchemy import DateTime, text
from sqlmodel import Session

from api.models import ApiToken
from api.principal import ROLES, TENANT_ROLES, Principal
from audit import Actor, record
from core.clock import Clock, as_utc, system_clock
from core.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from core.slugs import is_slug

if TYPE_CHECKING:
    from pki.keystore import KeyStore
    from workflows.context import AppContext

log = logging.getLogger("trustfabric.api.auth")

API_ISSUER_KEY_ID = "api-issuer"
MAX_TOKEN_BYTES = 8 * 1024
VERIFIED_CACHE_SIZE = 10_000
_TOKEN_ROW = text(
    "SELECT token_hash, role, tenant, subject, expires_at, revoked_at FROM api_tokens WHERE id = :id"
).columns(expires_at=DateTime(timezone=True), revoked_at=DateTime(timezone=True))
JWT_SVID_AUDIENCE = "trustfabric-api"
MINTABLE_ROLES = ("admin", "security", "tenant-admin", "tenant-member", "auditor")
_ALLOWED_ASYMMETRIC = ("ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA")


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
    from pki.keystore import KeyKind

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


def parse_ttl(text: str) -> timedelta:
    """`90s`, `15m`, `12h`, `7d` or plain seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)
    except ValueError:
        raise InvalidInput(f"TTL {text!r} is not a duration like 90s, 15m, 12h or 7d") from None
    if value <= 0:
        raise InvalidInput("TTL must be positive")
    return timedelta(seconds=value)


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
) -> tuple[str, ApiToken]:
    """Sign an API token and store its jti (revocable); returns the token (shown once) and its row."""
    if role not in MINTABLE_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(MINTABLE_ROLES)}, got {role!r}")
    if role in TENANT_ROLES:
        if tenant is None:
            raise InvalidInput(f"role {role} needs --tenant")
        if not is_slug(tenant):
            raise InvalidInput(f"tenant {tenant!r} is not a DNS label")
        from inventory.service import get_tenant

        get_tenant(session, tenant)
    elif tenant is not None:
        raise InvalidInput(f"role {role} is a platform role and takes no tenant")
    if ttl <= timedelta(0) or ttl > max_ttl:
        raise InvalidInput(f"TTL must be between 1s and {int(max_ttl.total_seconds())}s")
    if len(description) > 200:
        raise InvalidInput("description is at most 200 characters")
    subject = subject or (f"{role}@{tenant}" if tenant else role) + "-" + secrets.token_hex(3)
    if len(subject) > 256:
        raise InvalidInput("subject is at most 256 characters")
    key = issuer_public_key(keystore)
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
    token = jwt.encode(
        claims, keystore.get(API_ISSUER_KEY_ID).private_key(), algorithm="ES256",
        headers={"kid": key.kid, "typ": "JWT"},
    )
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


def revoke_token(
    session: Session, token_id: str, *, actor: Actor, reason: str, clock: Clock = system_clock
) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"token {token_id!r} not found")
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


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if len(token) > MAX_TOKEN_BYTES:
        raise Unauthenticated(f"bearer token larger than {MAX_TOKEN_BYTES} bytes")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise Unauthenticated(f"malformed bearer token: {exc}") from None
    if not isinstance(claims, dict):
        raise Unauthenticated("malformed bearer token")
    return header, claims


def _check_times(claims: dict[str, Any], now: datetime) -> None:
    ts = now.timestamp()
    exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
    for name, value in (("exp", exp), ("nbf", nbf), ("iat", iat)):
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise Unauthenticated(f"token claim {name} is not a number")
    if exp is None:
        raise Unauthenticated("token has no exp claim")
    if ts >= float(exp):
        raise Unauthenticated("token expired")
    if nbf is not None and ts < float(nbf):
        raise Unauthenticated("token not yet valid (nbf)")
    if iat is not None and float(iat) > ts + 60:
        raise Unauthenticated("token issued in the future (iat)")


def _decode(token: str, key: Any, algorithms: list[str], *, audience: str, issuer: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {
        "verify_exp": False, "verify_nbf": False, "verify_iat": False,  # checked against the injected clock
        "require": ["exp", "aud", "sub"],
    }
    try:
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=algorithms, audience=audience, issuer=issuer,
            options=options,  # type: ignore[arg-type]
        )
    except jwt.InvalidAudienceError:
        raise Unauthenticated("token audience is not this API") from None
    except jwt.InvalidIssuerError:
        raise Unauthenticated("token issuer is not trusted") from None
    except jwt.PyJWTError as exc:
        raise Unauthenticated(f"token rejected: {exc}") from None
    return claims


class JwksSource:
    """Public keys of an external OIDC issuer, from a JWKS file or URL (PyJWKClient caches and refreshes)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._client: jwt.PyJWKClient | None = None
        self._set: jwt.PyJWKSet | None = None
        if location.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(location, cache_keys=True, lifespan=300, timeout=5)
        else:
            with open(location, encoding="utf-8") as fh:
                self._set = jwt.PyJWKSet.from_json(fh.read())

    def key(self, kid: str) -> jwt.PyJWK:
        try:
            if self._client is not None:
                return self._client.get_signing_key(kid)
            assert self._set is not None
            return self._set[kid]
        except (KeyError, jwt.PyJWTError) as exc:
            raise Unauthenticated(f"unknown signing key id {kid!r} for the OIDC issuer ({exc})") from None


class SvidKeys:
    """JWT-SVID verification keys from our trust bundle, refreshed at most every `ttl` seconds."""

    def __init__(self, ctx: AppContext, ttl: float = 30.0) -> None:
        self.ctx = ctx
        self.ttl = ttl
        self._keys: dict[str, Any] = {}
        self._loaded = 0.0
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        keys: dict[str, Any] = {}
        jwks = jwt_svid_jwks(self.ctx)
        for entry in jwks:
            if entry.get("use") not in (None, "jwt-svid") or "kid" not in entry:
                continue
            try:
                keys[str(entry["kid"])] = jwt.PyJWK.from_dict(entry).key
            except jwt.PyJWTError:
                continue
        return keys

    def get(self, kid: str) -> Any | None:
        with self._lock:
            if kid not in self._keys or time.monotonic() - self._loaded > self.ttl:
                try:
                    self._keys = self._load()
                except Exception:  # fail closed: no bundle, no JWT-SVIDs
                    log.exception("cannot load the JWT-SVID bundle")
                    self._keys = {}
                self._loaded = time.monotonic()
            return self._keys.get(kid)


def jwt_svid_jwks(ctx: AppContext) -> list[dict[str, Any]]:
    """The `jwt-svid` keys of our trust bundle (from pki)."""
    from pki.bundle import bundle_document

    with ctx.db.read_session() as session:
        bundle = bundle_document(session)
    keys = bundle.get("keys", [])
    return [k for k in keys if isinstance(k, dict)]


def principal_from_spiffe_id(spiffe_id: str, trust_domain: str, auth: str) -> Principal:
    """`/node/<n>` is a node; `/tenant/<t>/group/<g>/<w>` a workload of tenant t; anything else is refused."""
    prefix = f"spiffe://{trust_domain}/"
    if not spiffe_id.startswith(prefix):
        raise Unauthenticated("SPIFFE ID is not in this trust domain")
    parts = spiffe_id[len(prefix):].split("/")
    if len(parts) == 2 and parts[0] == "node" and is_slug(parts[1]):
        return Principal(id=spiffe_id, role="node", tenant=None, auth=auth)
    if (len(parts) == 5 and parts[0] == "tenant" and parts[2] == "group"
            and all(is_slug(p) for p in (parts[1], parts[3], parts[4]))):
        return Principal(id=spiffe_id, role="workload", tenant=parts[1], auth=auth)
    raise Unauthenticated(f"SPIFFE ID {spiffe_id} names neither a node nor a workload")


class JwtAuthenticator:
    """The authenticator for bearer JWTs; opaque `tfo_` tokens are left to the opaque authenticator."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        s = ctx.settings
        self._issuer_key: IssuerKey | None = None
        self._oidc = JwksSource(s.oidc_jwks) if s.oidc_issuer and s.oidc_jwks else None
        self._svid_keys = SvidKeys(ctx)
        # Signature checks of our own tokens are cached by the exact token text (a signature verifies
        # the same way every time); times, revocation and the issued row are checked on every request.
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._verified_lock = threading.Lock()
        from api.readcache import ChangeWatch, ReadCache

        self._rows: ReadCache[Any] = ReadCache(ChangeWatch(ctx.db.engine, enabled=s.read_cache))

    def issuer_key(self) -> IssuerKey | None:
        if self._issuer_key is None:
            try:
                self._issuer_key = issuer_public_key(self.ctx.keystore)
            except Exception:
                return None
        return self._issuer_key

    def __call__(self, ctx: AppContext, request: Request) -> Principal | None:
        from api.deps import bearer_token
        from api.tokens import TOKEN_PREFIX

        token = bearer_token(request)
        if token is None or token.startswith(TOKEN_PREFIX):
            return None
        return self.authenticate(token)

    def authenticate(self, token: str) -> Principal:
        with self._verified_lock:
            verified = self._verified.get(token)
        if verified is not None:  # our own token, signature already checked: times and revocation now
            _check_times(verified, self.ctx.clock())
            return self._api_principal(verified, self.ctx.clock())
        header, unverified = _unverified(token)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthenticated("token has no kid header")
        if alg not in _ALLOWED_ASYMMETRIC:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted")
        now = self.ctx.clock()
        s = self.ctx.settings
        iss = unverified.get("iss")
        ours = self.issuer_key()
        if iss == s.api_issuer:
            if ours is None or kid != ours.kid:
                raise Unauthenticated(f"unknown signing key id {kid!r}")
            with self._verified_lock:
                cached = self._verified.get(token)
            if cached is None:
                cached = _decode(token, ours.public_key, ["ES256"], audience=s.api_audience, issuer=s.api_issuer)
                with self._verified_lock:
                    self._verified[token] = cached
                    while len(self._verified) > VERIFIED_CACHE_SIZE:
                        self._verified.popitem(last=False)
            _check_times(cached, now)
            return self._api_principal(cached, now)
        if s.oidc_issuer is not None and iss == s.oidc_issuer and self._oidc is not None:
            jwk = self._oidc.key(kid)
            if jwk.algorithm_name not in _ALLOWED_ASYMMETRIC or (alg != jwk.algorithm_name):
                raise Unauthenticated(f"token algorithm {alg!r} does not match the issuer's key")
            claims = _decode(token, jwk.key, [jwk.algorithm_name], audience=s.oidc_audience, issuer=s.oidc_issuer)
            _check_times(claims, now)
            return self._oidc_principal(claims)
        if iss is None or str(unverified.get("sub", "")).startswith("spiffe://"):
            key = self._svid_keys.get(kid)
            if key is None:
                raise Unauthenticated(f"unknown signing key id {kid!r}")
            if alg not in ("ES256", "ES384", "RS256", "PS256"):
                raise Unauthenticated(f"token algorithm {alg!r} is not accepted for JWT-SVIDs")
            claims = _decode(token, key, [str(alg)], audience=JWT_SVID_AUDIENCE, issuer=None)
            _check_times(claims, now)
            return self._svid_principal(str(claims["sub"]))
        raise Unauthenticated("token issuer is not trusted")

    def _svid_principal(self, spiffe_id: str) -> Principal:
        from sqlmodel import select

        from inventory.models import Workload
        from pki.revocation import identity_revoked
        from pki.spiffe_id import parse_spiffe_id
        from workflows.context import trust_domain

        with self.ctx.db.read_session() as session:
            principal = principal_from_spiffe_id(spiffe_id, trust_domain(self.ctx, session), "jwt-svid")
            if principal.tenant is not None:
                row = session.exec(select(Workload).where(Workload.spiffe_id == spiffe_id)).first()
                if row is None or row.revoked:
                    raise Unauthenticated(f"workload {spiffe_id} is not registered or is revoked")
                if identity_revoked(session, parse_spiffe_id(spiffe_id), principal.tenant) is not None:
                    raise Unauthenticated(f"identity {spiffe_id} is revoked")
        return principal

    def _api_principal(self, claims: dict[str, Any], now: datetime) -> Principal:
        jti = claims.get("jti")
        if not isinstance(jti, str) or len(jti) > 64:
            raise Unauthenticated("token has no valid jti")
        # One indexed lookup through SQLAlchemy Core (an ORM session costs several times more per request).
        row, version = self._rows.get(jti, now)
        if row is None:
            with self.ctx.reader.connect() as conn:
                row = conn.execute(_TOKEN_ROW, {"id": jti}).first()
            if row is not None:
                self._rows.put(jti, version, row)  # exact: any commit anywhere invalidates it
        if row is None or row.token_hash is not None:
            raise Unauthenticated("token unknown to this server")
        if row.revoked_at is not None:
            raise Unauthenticated("token revoked")
        if row.expires_at is not None and as_utc(row.expires_at) <= now:
            raise Unauthenticated("token expired")
        if claims.get("role") != row.role or claims.get("tenant") != row.tenant or claims.get("sub") != row.subject:
            raise Unauthenticated("token claims do not match the issued token")
        return Principal(id=row.subject, role=row.role, tenant=row.tenant, auth="jwt")

    def _oidc_principal(self, claims: dict[str, Any]) -> Principal:
        s = self.ctx.settings
        role = claims.get(s.oidc_role_claim)
        tenant = claims.get(s.oidc_tenant_claim)
        if role not in ROLES or role in ("node", "workload"):
            raise Unauthenticated(f"OIDC token has no usable {s.oidc_role_claim} claim")
        if role in TENANT_ROLES:
            if not isinstance(tenant, str) or not is_slug(tenant):
                raise Unauthenticated(f"OIDC token for role {role} needs a {s.oidc_tenant_claim} claim")
        else:
            tenant = None
        sub = str(claims["sub"])[:256]
        return Principal(id=f"oidc:{sub}", role=role, tenant=tenant, auth="oidc")


def utc_from_ts(value: int) -> datetime:
    return datetime.fromtimestamp(value, UTC)
