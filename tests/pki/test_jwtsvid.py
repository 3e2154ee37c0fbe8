"""JWT-SVIDs: py-spiffe validates them against the jwt-svid keys of our bundle; header and claims are
the spec's; a bad audience or TTL is refused with nothing recorded."""

from __future__ import annotations

import json
from datetime import timedelta

import jwt
import pytest
from spiffe import JwtBundle, JwtSvid, TrustDomain

from core.clock import FrozenClock
from core.errors import InvalidInput
from keys.file import FileKeyStore
from pki import service
from pki.errors import IdentityOutOfScope, TTLTooLong
from store.db import Database
from tests.pki.helpers import ADMIN, TD, actions, counts


def _jwt(db: Database, ks: FileKeyStore, clock: FrozenClock, **kw: object) -> service.IssuedJWT:
    args: dict[str, object] = {"tenant": "acme", "group": "web", "workload": "frontend", "audience": ["svc-a"],
                               "ttl": None, "actor": ADMIN, "scope_tenant": None, "clock": clock}
    args.update(kw)
    with db.session() as s:
        return service.issue_jwt_svid(s, ks, **args)  # type: ignore[arg-type]


def jwt_bundle(db: Database) -> JwtBundle:
    """go-spiffe style: the bundle's jwt-svid keys form the JWT bundle."""
    with db.read_session() as s:
        doc = service.bundle_jwks(s)
    keys = [k for k in doc["keys"] if k["use"] == "jwt-svid"]
    return JwtBundle.parse(TrustDomain(TD), json.dumps({"keys": keys}).encode())


def test_py_spiffe_validates_our_jwt_svid(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    issued = _jwt(pki_db, keystore, clock, audience=["svc-a", "svc-b"])
    svid = JwtSvid.parse_and_validate(issued.token, jwt_bundle(pki_db), {"svc-a"})
    assert str(svid.spiffe_id) == "spiffe://example.org/tenant/acme/group/web/frontend"
    header = jwt.get_unverified_header(issued.token)
    assert header["alg"] == "ES256" and header["kid"] == issued.kid and header["typ"] == "JWT"
    claims = jwt.decode(issued.token, options={"verify_signature": False})
    assert claims["aud"] == ["svc-a", "svc-b"]
    assert claims["exp"] - claims["iat"] == 300  # default 5 minutes
    assert actions(pki_db)[-1] == "svid.jwt.issue"
    with pytest.raises(Exception, match=r"(?i)audience"):
        JwtSvid.parse_and_validate(issued.token, jwt_bundle(pki_db), {"svc-z"})


def test_tampered_token_is_refused_by_py_spiffe(
    sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    issued = _jwt(sqlite_pki, keystore, clock)
    head, _payload, sig = issued.token.split(".")
    forged_claims = jwt.decode(issued.token, options={"verify_signature": False})
    forged_claims["sub"] = "spiffe://example.org/tenant/globex/group/train/trainer-0"
    forged_payload = jwt.utils.base64url_encode(json.dumps(forged_claims).encode()).decode()
    with pytest.raises(Exception, match=r"[Ss]ignature"):
        JwtSvid.parse_and_validate(f"{head}.{forged_payload}.{sig}", jwt_bundle(sqlite_pki), {"svc-a"})


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"audience": []}, InvalidInput),
        ({"audience": [""]}, InvalidInput),
        ({"audience": "svc-a"}, InvalidInput),
        ({"audience": ["a\nb"]}, InvalidInput),
        ({"audience": ["svc-a", "svc\x7f"]}, InvalidInput),
        ({"audience": ["svc-a", "svc-b", "svc-a"]}, InvalidInput),
        ({"ttl": timedelta(hours=2)}, TTLTooLong),
        ({"tenant": "globex", "group": "train", "workload": "trainer-0", "scope_tenant": "acme"}, IdentityOutOfScope),
    ],
)
def test_jwt_rejections_record_nothing(
    sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock, kwargs: dict[str, object],
    error: type[Exception],
) -> None:
    before = counts(sqlite_pki)
    with pytest.raises(error):
        _jwt(sqlite_pki, keystore, clock, **kwargs)
    assert counts(sqlite_pki) == before


def test_bundle_document_shape(sqlite_pki: Database) -> None:
    with sqlite_pki.read_session() as s:
        doc = service.bundle_jwks(s)
    assert doc["spiffe_sequence"] == 1 and doc["spiffe_refresh_hint"] > 0
    uses = sorted(k["use"] for k in doc["keys"])
    assert uses == ["jwt-svid", "x509-svid"]
    x509_key = next(k for k in doc["keys"] if k["use"] == "x509-svid")
    assert len(x509_key["x5c"]) == 1 and "kid" not in x509_key
    assert all("d" not in k for k in doc["keys"])  # never a private component
