"""JWT-SVIDs (SPIFFE JWT-SVID spec): signed JWS with `kid`, `sub` = SPIFFE ID, non-empty `aud`, `exp`, `iat`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import jwt

from core.errors import InvalidInput
from keys.store import Signer, jwt_alg
from pki.spiffe_id import SpiffeId

MAX_AUDIENCES = 16
MAX_AUDIENCE_LEN = 512


def check_audience(audience: Sequence[str]) -> list[str]:
    """A JWT-SVID must name at least one audience; each a non-empty string of bounded length."""
    if isinstance(audience, str) or not audience:
        raise InvalidInput("audience must be a non-empty list of strings (the services that will accept it)")
    if len(audience) > MAX_AUDIENCES:
        raise InvalidInput(f"at most {MAX_AUDIENCES} audiences per JWT-SVID")
    out: list[str] = []
    for aud in audience:
        if not isinstance(aud, str) or not aud.strip() or len(aud) > MAX_AUDIENCE_LEN:
            raise InvalidInput(f"each audience must be a non-empty string of at most {MAX_AUDIENCE_LEN} chars")
        out.append(aud)
    return out


def mint(
    signer: Signer, *, kid: str, spiffe_id: SpiffeId, audience: Sequence[str], issued_at: datetime,
    expires_at: datetime,
) -> str:
    """The compact JWS; the key is the generation's JWT key in the key store."""
    claims = {
        "sub": str(spiffe_id),
        "aud": list(audience),
        "iat": int(issued_at.timestamp()),
        "exp": int(expires_at.timestamp()),
    }
    return jwt.encode(
        claims, signer.private_key(), algorithm=jwt_alg(signer.kind), headers={"kid": kid, "typ": "JWT"}
    )
