"""JWT-SVIDs: workloads present a JWT-SVID with audience `trustfabric-api`, verified with the `jwt-svid`
keys of our own trust bundle; the workload must be registered and neither it nor its identity revoked."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import jwt

from api.auth.jwt_checks import check_times, decode
from api.principal import Principal, principal_from_spiffe_id
from core.errors import Unauthenticated

if TYPE_CHECKING:
    from workflows.context import AppContext

log = logging.getLogger("trustfabric.api.auth")

JWT_SVID_AUDIENCE = "trustfabric-api"
SVID_ALGORITHMS = ("ES256", "ES384", "RS256", "PS256")
SVID_TYPES = ("JWT", "JOSE")  # JWT-SVID spec 2.3: `typ` is optional, and one of these when set


def svid_key(ctx: AppContext, kid: str) -> Any | None:
    """The public key of the bundle's `jwt-svid` entry with this kid, read now (no cache: a key retired
    from the bundle is refused from the next request on); None when there is none or the bundle cannot be
    read (fail closed)."""
    try:
        jwks = jwt_svid_jwks(ctx)
    except Exception:
        log.exception("cannot load the JWT-SVID bundle")
        return None
    for entry in jwks:
        if entry.get("use") not in (None, "jwt-svid") or str(entry.get("kid")) != kid:
            continue
        try:
            return jwt.PyJWK.from_dict(entry).key
        except jwt.PyJWTError:
            return None
    return None


def jwt_svid_jwks(ctx: AppContext) -> list[dict[str, Any]]:
    """The `jwt-svid` keys of our trust bundle (from pki)."""
    from pki.bundle import bundle_document

    with ctx.db.read_session() as session:
        bundle = bundle_document(session)
    keys = bundle.get("keys", [])
    return [k for k in keys if isinstance(k, dict)]


class JwtSvidVerifier:
    """Verifies JWT-SVIDs of this trust domain."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    @staticmethod
    def accepts(iss: Any, sub: Any) -> bool:
        return iss is None or str(sub or "").startswith("spiffe://")

    def authenticate(self, token: str, alg: Any, kid: str, now: Any) -> Principal:
        key = svid_key(self.ctx, kid)
        if key is None:
            raise Unauthenticated(f"unknown signing key id {kid!r}")
        if alg not in SVID_ALGORITHMS:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted for JWT-SVIDs")
        typ = jwt.get_unverified_header(token).get("typ", "JWT")
        if typ not in SVID_TYPES:
            raise Unauthenticated(f"token typ {typ!r} is not accepted for JWT-SVIDs (JWT or JOSE)")
        claims = decode(token, key, [str(alg)], audience=JWT_SVID_AUDIENCE, issuer=None)
        check_times(claims, now)
        return self._principal(str(claims["sub"]))

    def _principal(self, spiffe_id: str) -> Principal:
        from inventory.service import workload_by_spiffe_id
        from pki.revocation import identity_revoked
        from pki.spiffe_id import parse_spiffe_id
        from workflows.context import trust_domain

        with self.ctx.db.read_session() as session:
            principal = principal_from_spiffe_id(spiffe_id, trust_domain(self.ctx, session), "jwt-svid")
            if principal.tenant is not None:
                row = workload_by_spiffe_id(session, spiffe_id)
                if row is None or row.revoked:
                    raise Unauthenticated(f"workload {spiffe_id} is not registered or is revoked")
                if identity_revoked(session, parse_spiffe_id(spiffe_id), principal.tenant) is not None:
                    raise Unauthenticated(f"identity {spiffe_id} is revoked")
        return principal

