"""JWT-SVIDs: workloads present a JWT-SVID with audience `trustfabric-api`, verified with the `jwt-svid`
keys of our own trust bundle; the workload must be registered and neither it nor its identity revoked."""

from __future__ import annotations

import logging
import threading
import time
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


class JwtSvidVerifier:
    """Verifies JWT-SVIDs of this trust domain."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self._keys = SvidKeys(ctx)

    @staticmethod
    def accepts(iss: Any, sub: Any) -> bool:
        return iss is None or str(sub or "").startswith("spiffe://")

    def authenticate(self, token: str, alg: Any, kid: str, now: Any) -> Principal:
        key = self._keys.get(kid)
        if key is None:
            raise Unauthenticated(f"unknown signing key id {kid!r}")
        if alg not in SVID_ALGORITHMS:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted for JWT-SVIDs")
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

