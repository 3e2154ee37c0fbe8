"""Console sessions without a server-side store, so any worker of any replica serves any request.

Signing in (with an API token, or through the OIDC issuer) proves a credential to the API itself
(GET /v1/whoami); the console then mints an API JWT for exactly that principal -- same subject, role and
tenant, and an expiry no later than the credential's own nor than `console_session_ttl` -- and the
session cookie carries that JWT. It is signed by the API issuer key (it cannot be forged), recorded by
its jti (so it is revocable, and signing out revokes it, on every replica at once), and its minting is
an audited `token.create` by the principal itself. The credential the person typed (possibly a
long-lived admin token) is never stored in a cookie, a page or a log.

CSRF: every state change carries a token derived from the session (HMAC keyed by the session JWT,
which a cross-site page can neither read nor guess) and must come from our own origin; the cookie is
SameSite=Strict, HttpOnly, and Secure under TLS. The sign-in form, before there is a session, carries a
random double-submit token of its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import jwt
from fastapi import Request, Response

from api.console.client import Api, ApiError
from api.principal import Principal
from api.routes.common import request_id
from api.workers import in_worker
from core.clock import as_utc
from core.errors import Unauthenticated
from core.vocabulary import MINTABLE_ROLES
from pki.tokens.service import (
    TOKEN_PREFIX,
    get_token,
    mint_token,
    opaque_token,
    revoke_token,
    source_claim,
    source_ids,
    verify_signed,
)
from workflows.context import AppContext

PATH = "/console"
SESSION_COOKIE = "tf_console"
LOGIN_COOKIE = "tf_console_login"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
MIN_SESSION = timedelta(seconds=30)
SESSION_NOTE = "console session"


class SignInError(Exception):
    """Why a sign-in failed, in words for the sign-in page."""


@dataclass(frozen=True)
class Me:
    """The signed-in principal as the API sees it (GET /v1/whoami)."""

    id: str
    role: str
    tenant: str | None
    auth: str

    @property
    def scope_tenant(self) -> str | None:
        return self.tenant if self.role in ("tenant-admin", "tenant-member") else None

    def principal(self) -> Principal:
        return Principal(id=self.id, role=self.role, tenant=self.tenant, auth=self.auth)  # type: ignore[arg-type]


def ctx_of(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


def api_for(request: Request, token: str) -> Api:
    return Api(request.app, token, request_id(request))


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def csrf_token(session_token: str) -> str:
    """The session's CSRF token: HMAC-SHA256 keyed by the session JWT (one-way: it reveals nothing of it)."""
    mac = hmac.new(session_token.encode(), b"trustfabric-console-csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def same_origin(request: Request) -> bool:
    """A state change must come from a page of ours: Sec-Fetch-Site and Origin, when the browser sends them."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin == f"{request.url.scheme}://{request.url.netloc}"


def csrf_ok(request: Request, session_token: str, submitted: str | None) -> bool:
    given = submitted or request.headers.get(CSRF_HEADER) or ""
    return same_origin(request) and hmac.compare_digest(given.encode(), csrf_token(session_token).encode())


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int, *,
               path: str = PATH, samesite: str = "strict") -> None:
    response.set_cookie(name, value, max_age=max_age, path=path, httponly=True, secure=secure(request),
                        samesite=samesite)  # type: ignore[arg-type]


def clear_cookie(response: Response, request: Request, name: str, *, path: str = PATH,
                 samesite: str = "strict") -> None:
    response.delete_cookie(name, path=path, httponly=True, secure=secure(request), samesite=samesite)  # type: ignore[arg-type]


def new_login_token() -> str:
    return secrets.token_urlsafe(24)


def login_token_ok(request: Request, submitted: str | None) -> bool:
    cookie = request.cookies.get(LOGIN_COOKIE) or ""
    return bool(cookie) and same_origin(request) and hmac.compare_digest(cookie.encode(), (submitted or "").encode())


async def whoami(request: Request, token: str) -> Me:
    body = await api_for(request, token).get("/v1/whoami")
    return Me(id=body["id"], role=body["role"], tenant=body["tenant"], auth=body["auth"])


def credential_expiry(ctx: AppContext, credential: str) -> tuple[datetime | None, tuple[str, ...]]:
    """(when the credential stops being valid (None: no expiry), the ids of the tokens of ours the session stands in
    for: its `src`, so revoking any of them ends the session -- the credential's own, after those it stood in for
    when it is a session itself; none for another issuer's, e.g. OIDC). Read after the API accepted it."""
    if credential.startswith(TOKEN_PREFIX):
        with ctx.db.read_session() as session:
            row = opaque_token(session, credential, ctx.clock)
        return (as_utc(row.expires_at) if row.expires_at is not None else None), (row.id,)
    claims = jwt.decode(credential, options={"verify_signature": False})
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise Unauthenticated("token has no exp claim")
    source: tuple[str, ...] = ()
    if claims.get("iss") == ctx.settings.api_issuer:
        # one of ours: a session made from a session ends with that session too, not only with the first credential
        jti = claims.get("jti")
        if not isinstance(jti, str):
            raise Unauthenticated("token has no jti claim")
        try:
            source = (*(source_ids(claims["src"]) if "src" in claims else ()), jti)
            source_claim(source)
        except ValueError as exc:
            raise Unauthenticated(f"{exc}: sign in with the API token itself") from None
    return datetime.fromtimestamp(float(exp), tz=UTC), source


def _mint(ctx: AppContext, me: Me, expires_at: datetime, rid: str, source: tuple[str, ...]) -> str:
    now = ctx.clock().replace(microsecond=0)
    ttl = expires_at.replace(microsecond=0) - now
    with ctx.db.session() as session:
        token, _row = mint_token(
            session, ctx.keystore, role=me.role, tenant=me.tenant, ttl=ttl, actor=me.principal().actor(),
            issuer=ctx.settings.api_issuer, audience=ctx.settings.api_audience, max_ttl=ctx.settings.max_token_ttl,
            subject=me.id, description=SESSION_NOTE, clock=ctx.clock, request_id=rid, source=source,
        )
    return token


async def start_session(request: Request, credential: str) -> tuple[str, Me, datetime]:
    """(session JWT, principal, expiry) for a credential the API accepts; SignInError otherwise."""
    credential = credential.strip()
    if not credential:
        raise SignInError("paste an API token")
    try:
        me = await whoami(request, credential)
    except ApiError as exc:
        reason = exc.reason
        if reason.startswith("malformed bearer token"):  # PyJWT's words ("Not enough segments") say nothing here
            reason = ("it is not an API token (one from `trustfabric token create` starts with eyJ, the bootstrap "
                      "admin token with tfo_): paste the whole token")
        raise SignInError(f"the API refused this credential: {reason}") from None
    if me.role not in MINTABLE_ROLES:
        raise SignInError(f"a {me.role} identity cannot use the console (people sign in as "
                          f"{', '.join(MINTABLE_ROLES)})")
    ctx = ctx_of(request)
    now = ctx.clock()
    try:
        expiry, source = await in_worker(request, credential_expiry, ctx, credential)
    except (Unauthenticated, jwt.PyJWTError) as exc:
        raise SignInError(f"cannot tell when this credential expires: {exc}") from None
    expires_at = min(t for t in (now + ctx.settings.console_session_ttl, expiry) if t is not None)
    if expires_at - now < MIN_SESSION:
        raise SignInError("this credential expires in less than 30 seconds: use a fresh one")
    token = await in_worker(request, _mint, ctx, me, expires_at, request_id(request), source)
    return token, me, expires_at


def _jti(ctx: AppContext, token: str) -> str | None:
    try:
        claims = verify_signed(ctx.keystore, token, audience=ctx.settings.api_audience,
                               issuer=ctx.settings.api_issuer, verify_exp=False)
    except jwt.PyJWTError:
        return None
    jti = claims.get("jti")
    return jti if isinstance(jti, str) else None


def _revoke(ctx: AppContext, token: str, me: Me) -> None:
    jti = _jti(ctx, token)
    if jti is None:
        return
    with ctx.db.session() as session:
        row = get_token(session, jti)
        if row is None or row.revoked_at is not None or row.subject != me.id or row.description != SESSION_NOTE:
            return
        revoke_token(session, jti, actor=me.principal().actor(), reason="signed out of the console", clock=ctx.clock)


async def end_session(request: Request, token: str) -> None:
    """Revoke the session's JWT (an audited token.revoke by the principal): a copied cookie stops working."""
    try:
        me = await whoami(request, token)
    except ApiError:
        return  # already expired or revoked
    await in_worker(request, _revoke, ctx_of(request), token, me)
