"""Our own API tokens: ES256 JWTs signed by the `api-issuer` key in the KeyStore (pki/tokens mints them),
revocable by `jti`. The signature check of a token is cached by its exact text (a signature verifies the
same way every time); times, revocation and the issued row are checked on every request (the row
through an exact read cache: any commit anywhere invalidates it, see api/caches.py; on PostgreSQL, for a route that
carries it, in the request's first statement: `RowCheck`, store/carried.py)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from api.auth.jwt_checks import check_times, decode
from api.caches import cache_on
from api.principal import Principal
from api.readcache import ChangeWatch, ReadCache
from core.clock import as_utc
from core.errors import Unauthenticated
from core.vocabulary import ROLES
from pki.tokens.service import IssuerKey, issued_row, issued_row_admits, issuer_public_key, source_ids
from store import carried

if TYPE_CHECKING:
    from workflows.context import AppContext

VERIFIED_CACHE_SIZE = 10_000


class ApiJwtVerifier:
    """Verifies tokens whose issuer is this API (settings.api_issuer)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self._issuer_key: IssuerKey | None = None
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._verified_lock = threading.Lock()
        off = ctx.settings.cache_off
        self._sig_cache = cache_on(off, "token_signature")
        rows_on = ctx.settings.read_cache and cache_on(off, "token_row")
        self._rows: ReadCache[Any] = ReadCache(ChangeWatch(ctx.db, enabled=rows_on, bounded=False))
        # PostgreSQL, where the row is read on every request (no exact cache there): a route that reads the database
        # first anyway carries the row's check in that statement (api/handoff.py, store/carried.py)
        engine = ctx.db.engine
        self._carry = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"

    def accepts(self, iss: Any) -> bool:
        return bool(iss == self.ctx.settings.api_issuer)

    def issuer_key(self) -> IssuerKey | None:
        if self._issuer_key is None:
            try:
                self._issuer_key = issuer_public_key(self.ctx.keystore)
            except Exception:
                return None
        return self._issuer_key

    def already_verified(self, token: str) -> Principal | None:
        """The principal of a token whose signature this process checked before (times and row now)."""
        if not self._sig_cache:
            return None
        with self._verified_lock:
            verified = self._verified.get(token)
        if verified is None:
            return None
        now = self.ctx.clock()
        check_times(verified, now)
        return self._principal(verified, now)

    def authenticate(self, token: str, kid: str, now: datetime) -> Principal:
        s = self.ctx.settings
        ours = self.issuer_key()
        if ours is None or kid != ours.kid:
            raise Unauthenticated(f"unknown signing key id {kid!r}")
        cached = None
        if self._sig_cache:
            with self._verified_lock:
                cached = self._verified.get(token)
        if cached is None:
            cached = decode(token, ours.public_key, ["ES256"], audience=s.api_audience, issuer=s.api_issuer)
        if self._sig_cache:
            with self._verified_lock:
                self._verified[token] = cached
                while len(self._verified) > VERIFIED_CACHE_SIZE:
                    self._verified.popitem(last=False)
        check_times(cached, now)
        return self._principal(cached, now)

    def _principal(self, claims: dict[str, Any], now: datetime) -> Principal:
        jti = claims.get("jti")
        if not isinstance(jti, str) or len(jti) > 64:
            raise Unauthenticated("token has no valid jti")
        if self._carry and carried.deferrable() and "src" not in claims:  # a source's row: read below
            role, tenant, subject = claims.get("role"), claims.get("tenant"), claims.get("sub")
            if role in ROLES and isinstance(subject, str) and (tenant is None or isinstance(tenant, str)):
                # the row is read by the request's first statement (store/carried.py), before it acts or answers
                carried.defer(RowCheck(self, claims, now))
                return Principal(id=subject, role=role, tenant=tenant, auth="jwt")
        return self.checked_principal(claims, now)

    def checked_principal(self, claims: dict[str, Any], now: datetime) -> Principal:
        """The principal of these (signed, timely) claims once the token's row is read and admits them."""
        row = self._row(claims["jti"], now)
        if row is None or row.token_hash is not None:
            raise Unauthenticated("token unknown to this server")
        if row.revoked_at is not None:
            raise Unauthenticated("token revoked")
        if row.expires_at is not None and as_utc(row.expires_at) <= now:
            raise Unauthenticated("token expired")
        if claims.get("role") != row.role or claims.get("tenant") != row.tenant or claims.get("sub") != row.subject:
            raise Unauthenticated("token claims do not match the issued token")
        if "src" in claims:
            self._check_source(claims["src"], now)
        return Principal(id=row.subject, role=row.role, tenant=row.tenant, auth="jwt")

    def _row(self, token_id: str, now: datetime) -> Any:
        row, version = self._rows.get(token_id, now)
        if row is None:
            row = issued_row(self.ctx.db, token_id)
            if row is not None:
                self._rows.put(token_id, version, row)  # exact: any commit anywhere invalidates it
        return row

    def _check_source(self, source: Any, now: datetime) -> None:
        """A token minted to stand in for others (a console session, its `src` claim: the credential signed in with,
        and every session that one stood in for, pki.tokens.service.mint_token) lives no longer than any of them:
        revoking a stolen token, or a stolen session, ends the sessions opened from it. Fail closed: a source not
        issued here (or a malformed claim) refuses too."""
        try:
            ids = source_ids(source)
        except ValueError:
            raise Unauthenticated("token has no valid src") from None
        for token_id in ids:
            row = self._row(token_id, now)
            if row is None:
                raise Unauthenticated("the credential this token was made from is unknown to this server")
            if row.revoked_at is not None:
                raise Unauthenticated("the credential this token was made from is revoked")
            if row.expires_at is not None and as_utc(row.expires_at) <= now:
                raise Unauthenticated("the credential this token was made from has expired")



class RowCheck:
    """The check of a JWT's `api_tokens` row (issued here, not revoked, not expired, the claims' role, tenant and
    subject), made in a later statement of the request (store/carried.py's CarriedCheck): its value true admits; any
    other is the row read again on its own (`checked_principal`) for the exact reason, which is raised."""

    def __init__(self, verifier: ApiJwtVerifier, claims: dict[str, Any], now: datetime) -> None:
        self._verifier, self._claims, self._now = verifier, claims, now
        self._error: Unauthenticated | None = None
        self._made = False

    @property
    def pending(self) -> bool:
        return not self._made and self._error is None

    def subquery(self) -> tuple[str, tuple[Any, ...]]:
        c = self._claims
        return issued_row_admits(c["jti"], role=c["role"], tenant=c.get("tenant"), subject=c["sub"], now=self._now)

    def settle(self, value: Any) -> None:
        if value is True and self._error is None:
            self._made = True
            return
        self.make()

    def make(self) -> None:
        if self._error is not None:
            raise self._error
        if self._made:
            return
        try:
            self._verifier.checked_principal(self._claims, self._now)
        except Unauthenticated as exc:
            self._error = exc
            raise
        self._made = True
