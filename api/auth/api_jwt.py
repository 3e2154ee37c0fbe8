"""Our own API tokens: ES256 JWTs signed by the `api-issuer` key in the KeyStore (pki/tokens mints them),
revocable by `jti`. The signature check of a token is cached by its exact text (a signature verifies the
same way every time); times, revocation and the issued row are checked on every request (the row
through an exact read cache: any commit anywhere invalidates it, see api/caches.py)."""

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
from pki.tokens.service import IssuerKey, issued_row, issuer_public_key

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
        row, version = self._rows.get(jti, now)
        if row is None:
            row = issued_row(self.ctx.db, jti)
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

