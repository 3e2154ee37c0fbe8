"""Bearer tokens: which way of establishing identity a presented token takes. An opaque `tfo_` secret goes to
api/auth/opaque.py; a JWT is read once (unverified) and handed by its issuer to exactly one verifier: our
own API tokens (api_jwt.py), the configured OIDC issuer (oidc.py) or a JWT-SVID (jwt_svid.py). The
verifier pins the algorithm per issuer (ES256 for ours and for JWT-SVIDs; the JWKS key's own for OIDC),
so `alg: none` and HS256-with-the-public-key-as-secret never reach a signature check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from api.auth.api_jwt import ApiJwtVerifier
from api.auth.jwt_checks import ALLOWED_ASYMMETRIC, unverified
from api.auth.jwt_svid import JwtSvidVerifier
from api.auth.oidc import OidcVerifier
from api.principal import Principal
from core.errors import Unauthenticated
from pki.tokens.service import TOKEN_PREFIX

if TYPE_CHECKING:
    from workflows.context import AppContext


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated("Authorization header must be 'Bearer <token>'")
    return value.strip()


class JwtAuthenticator:
    """The authenticator for bearer JWTs; opaque `tfo_` tokens are left to the opaque authenticator."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.api = ApiJwtVerifier(ctx)
        self.oidc = OidcVerifier(ctx.settings)
        self.svid = JwtSvidVerifier(ctx)

    def __call__(self, ctx: AppContext, request: Request) -> Principal | None:
        token = bearer_token(request)
        if token is None or token.startswith(TOKEN_PREFIX):
            return None
        return self.authenticate(token)

    def authenticate(self, token: str) -> Principal:
        known = self.api.already_verified(token)
        if known is not None:
            return known
        header, claims = unverified(token)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthenticated("token has no kid header")
        if alg not in ALLOWED_ASYMMETRIC:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted")
        now = self.ctx.clock()
        iss = claims.get("iss")
        if self.api.accepts(iss):
            return self.api.authenticate(token, kid, now)
        if self.oidc.accepts(iss):
            return self.oidc.authenticate(token, alg, kid, now)
        if self.svid.accepts(iss, claims.get("sub")):
            return self.svid.authenticate(token, alg, kid, now)
        raise Unauthenticated("token issuer is not trusted")
