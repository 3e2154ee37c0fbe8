"""The SPIFFE bundle (SPIFFE Trust Domain and Bundle spec): a JWKS whose keys carry `use` =
`x509-svid` (with `x5c`: the root of every published generation) or `jwt-svid` (with `kid`)."""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sqlmodel import Session

from keys.store import PublicKey
from pki.ca import PUBLISHED_STATES, certificate, generation_cas, load_settings

REFRESH_HINT_SECONDS = 300


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk_for(key: PublicKey) -> dict[str, Any]:
    """RFC 7517/8037 public JWK for an EC or Ed25519 key."""
    if isinstance(key, ed25519.Ed25519PublicKey):
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw)}
    if isinstance(key, ec.EllipticCurvePublicKey):
        size = (key.curve.key_size + 7) // 8
        nums = key.public_numbers()
        crv = {"secp256r1": "P-256", "secp384r1": "P-384"}[key.curve.name]
        return {"kty": "EC", "crv": crv, "x": _b64url(nums.x.to_bytes(size, "big")),
                "y": _b64url(nums.y.to_bytes(size, "big"))}
    raise TypeError(f"no JWK form for {type(key).__name__}")


def bundle_document(session: Session) -> dict[str, Any]:
    """The bundle as a dict; prepared generations are included so peers trust them before first use."""
    settings = load_settings(session)
    keys: list[dict[str, Any]] = []
    for ca in generation_cas(session, PUBLISHED_STATES):
        if ca.role == "root":
            cert = certificate(ca)
            pub = cert.public_key()
            assert isinstance(pub, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
            keys.append({"use": "x509-svid", **jwk_for(pub),
                         "x5c": [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]})
        elif ca.jwt_public_pem and ca.jwt_kid:
            jwt_pub = serialization.load_pem_public_key(ca.jwt_public_pem.encode())
            assert isinstance(jwt_pub, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
            keys.append({"use": "jwt-svid", "kid": ca.jwt_kid, **jwk_for(jwt_pub)})
    return {"keys": keys, "spiffe_sequence": settings.bundle_sequence, "spiffe_refresh_hint": REFRESH_HINT_SECONDS}


def bundle_roots_pem(session: Session) -> bytes:
    """The published roots as concatenated PEM (the X.509 trust anchors)."""
    load_settings(session)
    return b"".join(
        certificate(ca).public_bytes(serialization.Encoding.PEM)
        for ca in generation_cas(session, PUBLISHED_STATES)
        if ca.role == "root"
    )
