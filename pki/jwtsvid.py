"""JWT-SVIDs (SPIFFE JWT-SVID spec): signed JWS with `kid`, `sub` = SPIFFE ID, non-empty `aud`, `exp`, `iat`."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from datetime import datetime

import jwt

from core.errors import InvalidInput
from keys.store import Signer, jwt_alg
from pki.spiffe_id import SpiffeId

MAX_AUDIENCES = 16
MAX_AUDIENCE_LEN = 512


def check_audience(audience: Sequence[str]) -> list[str]:
    """A JWT-SVID must name at least one audience (JWT-SVID spec 3.2); each a non-empty string of bounded length
    without control characters (a service name or URI, RFC 7519's StringOrURI: a newline in one forges an extra
    line wherever the audit summary or a log prints it), and each once. A duplicate is refused, not dropped: a
    validator only asks whether its own name is present (RFC 7519 4.1.3), so a second copy adds nothing, and a
    list repeating a name is a caller's mistake worth reporting (the answer echoes `audience` exactly as given)."""
    if isinstance(audience, str) or not audience:
        raise InvalidInput("audience must be a non-empty list of strings (the services that will accept it)")
    if len(audience) > MAX_AUDIENCES:
        raise InvalidInput(f"at most {MAX_AUDIENCES} audiences per JWT-SVID")
    out: list[str] = []
    for i, aud in enumerate(audience):
        if not isinstance(aud, str) or not aud.strip() or len(aud) > MAX_AUDIENCE_LEN:
            raise InvalidInput(f"each audience must be a non-empty string of at most {MAX_AUDIENCE_LEN} chars")
        control = next((c for c in aud if unicodedata.category(c) == "Cc"), None)
        if control is not None:
            raise InvalidInput(f"audience[{i}] contains the control character U+{ord(control):04X}: an audience "
                               "is a service name or URI")
        if aud in out:
            raise InvalidInput(f"audience[{i}] repeats {aud!r} (audience[{out.index(aud)}]): name each audience "
                               "once")
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
