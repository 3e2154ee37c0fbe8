"""What every JWT way of authenticating shares: size and shape checks, the pinned-algorithm decode, and
time checks against the injectable clock with no leeway. Every failure is Unauthenticated (HTTP 401)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import jwt

from core.errors import Unauthenticated

MAX_TOKEN_BYTES = 8 * 1024
ALLOWED_ASYMMETRIC = ("ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA")


def unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
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


def check_times(claims: dict[str, Any], now: datetime) -> None:
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


def decode(token: str, key: Any, algorithms: list[str], *, audience: str, issuer: str | None) -> dict[str, Any]:
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


