"""OIDC: bearer JWTs from an external issuer (TRUSTFABRIC_OIDC_ISSUER), verified with its JWKS (a file or
a URL; PyJWKClient caches and refreshes); role and tenant come from configured claims."""

from __future__ import annotations

from typing import Any

import jwt

from api.auth.jwt_checks import ALLOWED_ASYMMETRIC, check_times, decode
from api.principal import Principal
from core.errors import Unauthenticated
from core.slugs import is_slug
from core.vocabulary import ROLES, TENANT_ROLES
from workflows.settings import Settings


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


class OidcVerifier:
    """Verifies tokens of the configured OIDC issuer; None when none is configured."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._jwks = JwksSource(settings.oidc_jwks) if settings.oidc_issuer and settings.oidc_jwks else None

    def accepts(self, iss: Any) -> bool:
        return self.settings.oidc_issuer is not None and iss == self.settings.oidc_issuer and self._jwks is not None

    def authenticate(self, token: str, alg: Any, kid: str, now: Any) -> Principal:
        s = self.settings
        assert self._jwks is not None
        jwk = self._jwks.key(kid)
        if jwk.algorithm_name not in ALLOWED_ASYMMETRIC or (alg != jwk.algorithm_name):
            raise Unauthenticated(f"token algorithm {alg!r} does not match the issuer's key")
        claims = decode(token, jwk.key, [jwk.algorithm_name], audience=s.oidc_audience, issuer=s.oidc_issuer)
        check_times(claims, now)
        return self._principal(claims)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        s = self.settings
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


