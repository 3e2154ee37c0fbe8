"""The JWT attack catalogue: each forged or stale token gets 401 and changes nothing; the good ones work."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sqlmodel import func, select

from audit import Actor
from audit.models import AuditEvent
from inventory.models import Tenant
from pki.service import issue_jwt_svid
from pki.tokens.service import API_ISSUER_KEY_ID, issuer_public_key
from tests.api.conftest import Env, make_settings, open_env, seed

NEW_TENANT = {"slug": "evil", "display_name": "Evil"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(env: Env, **over: Any) -> dict[str, Any]:
    now = int(env.clock().timestamp())
    base = {"iss": env.ctx.settings.api_issuer, "aud": env.ctx.settings.api_audience, "sub": "admin-x",
            "jti": "0" * 32, "iat": now, "nbf": now, "exp": now + 600, "role": "admin"}
    base.update(over)
    return base


def sign_ours(env: Env, payload: dict[str, Any], **headers: Any) -> str:
    key = issuer_public_key(env.ctx.keystore)
    private = env.ctx.keystore.get(API_ISSUER_KEY_ID).private_key()
    return jwt.encode(payload, private, algorithm="ES256", headers={"kid": key.kid, **headers})


def audit_count(env: Env) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(AuditEvent)).one())


def assert_rejected(env: Env, token: str, fragment: str = "") -> None:
    """401 on a read and on a mutation, and nothing written."""
    before = audit_count(env)
    r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text
    assert fragment in r.json()["reason"], r.json()
    r = env.client.post("/v1/tenants", json=NEW_TENANT, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text
    assert r.headers.get("www-authenticate") == "Bearer"
    assert audit_count(env) == before
    with env.ctx.db.read_session() as s:
        assert s.get(Tenant, "evil") is None


def test_minted_token_works_and_is_admin(env: Env) -> None:
    token = env.token("admin")
    r = env.client.post("/v1/tenants", json=NEW_TENANT, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text
    who = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()
    assert who["role"] == "admin" and who["auth"] == "jwt"


def test_alg_none_rejected(env: Env) -> None:
    key = issuer_public_key(env.ctx.keystore)
    header = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": key.kid}).encode())
    body = b64(json.dumps(claims(env)).encode())
    assert_rejected(env, f"{header}.{body}.", "algorithm")
    assert_rejected(env, f"{header}.{body}.AAAA", "algorithm")


def test_hs256_with_public_key_as_secret_rejected(env: Env) -> None:
    key = issuer_public_key(env.ctx.keystore)
    pem = key.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    body = b64(json.dumps(claims(env)).encode())
    sig = hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
    assert_rejected(env, f"{header}.{body}.{b64(sig)}", "algorithm")


def test_unknown_kid_and_foreign_key_rejected(env: Env) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    assert_rejected(env, jwt.encode(claims(env), other, algorithm="ES256", headers={"kid": "nope"}), "unknown")
    # a foreign key under our kid: the signature does not verify
    key = issuer_public_key(env.ctx.keystore)
    assert_rejected(env, jwt.encode(claims(env), other, algorithm="ES256", headers={"kid": key.kid}), "rejected")
    assert_rejected(env, jwt.encode(claims(env), other, algorithm="ES256"), "kid")


def test_expired_and_not_yet_valid_rejected(env: Env) -> None:
    token = env.token("admin", ttl=timedelta(seconds=60))
    ok = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    env.clock.advance(timedelta(seconds=60))
    assert_rejected(env, token, "expired")
    now = int(env.clock().timestamp())
    assert_rejected(env, sign_ours(env, claims(env, nbf=now + 30, iat=now)), "not yet valid")
    assert_rejected(env, sign_ours(env, claims(env, exp=now - 1)), "expired")
    no_exp = claims(env)
    del no_exp["exp"]
    assert_rejected(env, sign_ours(env, no_exp))


def test_wrong_issuer_or_audience_rejected(env: Env) -> None:
    assert_rejected(env, sign_ours(env, claims(env, iss="https://evil.example")), "")
    assert_rejected(env, sign_ours(env, claims(env, aud="some-other-api")), "audience")


def test_token_not_issued_by_server_or_claims_tampered_rejected(env: Env) -> None:
    # Validly signed (as if the key leaked) but never issued: no jti row.
    assert_rejected(env, sign_ours(env, claims(env)), "unknown to this server")
    # A real tenant token's jti with the role raised to admin.
    real = env.token("tenant-member", "acme")
    real_claims = jwt.decode(real, options={"verify_signature": False})
    forged = sign_ours(env, {**real_claims, "role": "admin"})
    assert_rejected(env, forged, "do not match")


def test_revoked_token_rejected(env: Env) -> None:
    token = env.token("admin")
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    assert env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    r = env.call("POST", f"/v1/tokens/{jti}/revoke", "admin", json={"reason": "leaked"})
    assert r.status_code == 200, r.text
    assert r.json()["revoked_at"] is not None
    assert_rejected(env, token, "revoked")


def test_oversized_and_garbage_tokens_rejected(env: Env) -> None:
    big = sign_ours(env, claims(env, pad="x" * 9000))
    assert len(big) > 8192
    assert_rejected(env, big, "larger than")
    assert_rejected(env, "not.a.jwt", "malformed")
    assert_rejected(env, "x" * 20000, "larger than")
    r = env.client.get("/v1/whoami", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    r = env.client.get("/v1/whoami")
    assert r.status_code == 401 and "authentication required" in r.json()["reason"]


def test_opaque_admin_token_still_works(env: Env) -> None:
    from tests.api.conftest import admin_opaque

    token = admin_opaque(env)
    r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["auth"] == "token"
    assert_rejected(env, token[:-2] + "xx", "invalid")


def test_jwt_svid_is_a_workload_principal(env: Env) -> None:
    def svid(audience: list[str]) -> str:
        with env.ctx.db.session() as s:
            return issue_jwt_svid(s, env.ctx.keystore, tenant="acme", group="web", workload="web-1",
                                  audience=audience, ttl=None, actor=Actor.system("t"), scope_tenant=None,
                                  clock=env.clock).token

    good = svid(["trustfabric-api"])
    r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {good}"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "spiffe://example.org/tenant/acme/group/web/web-1", "role": "workload",
                        "tenant": "acme", "auth": "jwt-svid"}
    # a workload may not act on grants (api_authz.rego has no rule for it)
    assert env.client.get("/v1/grants", headers={"Authorization": f"Bearer {good}"}).status_code == 403
    assert_rejected(env, svid(["some-other-service"]), "audience")
    # revoked identity: refused from then on
    r = env.call("POST", "/v1/tenants/acme/groups/web/workloads/web-1/revoke", "security",
                 json={"reason": "compromised"})
    assert r.status_code == 200, r.text
    assert_rejected(env, good, "revoked")


def test_jwt_svid_typ_must_be_jwt_or_jose(env: Env) -> None:
    """JWT-SVID spec 2.3: `typ` is optional and, when set, JWT or JOSE. Tokens signed with the trust domain's own
    JWT-SVID key (as the server signs them), differing only in `typ`: any value used to be accepted."""
    from pki.ca import active_issuing

    with env.ctx.db.read_session() as s:
        ca = active_issuing(s, env.clock(), lock=False)
    assert ca.jwt_key_id is not None and ca.jwt_kid is not None
    private = env.ctx.keystore.get(ca.jwt_key_id).private_key()
    now = int(env.clock().timestamp())
    body = {"sub": "spiffe://example.org/tenant/acme/group/web/web-1", "aud": ["trustfabric-api"], "iat": now,
            "exp": now + 300}

    def svid(**typ: str) -> str:
        return jwt.encode(body, private, algorithm="ES256", headers={"kid": ca.jwt_kid, **typ})

    for good in (svid(), svid(typ="JWT"), svid(typ="JOSE")):
        r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 200 and r.json()["auth"] == "jwt-svid", r.text
    assert_rejected(env, svid(typ="at+jwt"), "typ")
    assert_rejected(env, svid(typ="jwt"), "typ")  # exactly the two values the spec names


def test_oidc_issuer_with_jwks_file(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": "idp-1", "alg": "RS256", "use": "sig"})
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    e = open_env(make_settings(tmp_path / "home", oidc_issuer="https://idp.example", oidc_jwks=str(jwks)))
    try:
        seed(e)
        now = int(time.time())
        base = {"iss": "https://idp.example", "aud": "trustfabric-api", "sub": "alice", "iat": now,
                "exp": now + 300, "trustfabric_role": "tenant-member", "trustfabric_tenant": "acme"}
        good = jwt.encode(base, key, algorithm="RS256", headers={"kid": "idp-1"})
        r = e.client.get("/v1/whoami", headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 200, r.text
        assert r.json() == {"id": "oidc:alice", "role": "tenant-member", "tenant": "acme", "auth": "oidc"}
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        assert_rejected(e, jwt.encode(base, other, algorithm="RS256", headers={"kid": "idp-1"}), "rejected")
        assert_rejected(e, jwt.encode(base, key, algorithm="RS256", headers={"kid": "idp-2"}), "unknown")
        assert_rejected(e, jwt.encode({**base, "aud": "x"}, key, algorithm="RS256", headers={"kid": "idp-1"}),
                        "audience")
        assert_rejected(e, jwt.encode({**base, "trustfabric_role": "root"}, key, algorithm="RS256",
                                      headers={"kid": "idp-1"}), "role")
        # HS256 with the RSA public key as the secret: pinned to the JWKS key's algorithm
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
        header = b64(json.dumps({"alg": "HS256", "kid": "idp-1"}).encode())
        body = b64(json.dumps(base).encode())
        sig = hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
        assert_rejected(e, f"{header}.{body}.{b64(sig)}", "algorithm")
    finally:
        e.client.close()
        e.ctx.close()


@pytest.mark.parametrize("role,tenant", [("tenant-admin", None), ("admin", "acme"), ("node", None)])
def test_token_create_refuses_bad_role_tenant_combinations(env: Env, role: str, tenant: str | None) -> None:
    r = env.call("POST", "/v1/tokens", "admin", json={"role": role, "tenant": tenant, "ttl_seconds": 60})
    assert r.status_code in (400, 422), r.text


def test_a_token_minted_for_another_dies_with_it(env_both: Env) -> None:
    """A token that stands in for another (the console's session: `src`, the credential signed in with) is refused
    once that one is revoked, on both databases and on a route that carries its token check in its first statement
    on PostgreSQL (POST /v1/grants); a `src` this server never issued is refused from the start."""
    from pki.tokens.service import mint_token

    env = env_both
    source = env.token("tenant-admin", "acme", ttl=timedelta(hours=2))
    jti = jwt.decode(source, options={"verify_signature": False})["jti"]

    def minted(*src: str) -> str:
        with env.ctx.db.session() as s:
            token, _row = mint_token(s, env.ctx.keystore, role="tenant-admin", tenant="acme", ttl=timedelta(hours=1),
                                     actor=Actor.system("test"), issuer=env.ctx.settings.api_issuer,
                                     audience=env.ctx.settings.api_audience, max_ttl=env.ctx.settings.max_token_ttl,
                                     subject="alice", source=src, clock=env.clock)
        return token

    derived = minted(jti)
    # a session of a session names both; revoking the second (the session it was opened with) ends it
    middle = minted(jti)
    chained = minted(jti, jwt.decode(middle, options={"verify_signature": False})["jti"])
    grant = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
             "ttl_seconds": 3600}

    def status(method: str, path: str, token: str) -> int:
        r = env.client.request(method, path, headers={"Authorization": f"Bearer {token}"},
                               json=grant if method == "POST" else None)
        return int(r.status_code)

    assert status("GET", "/v1/whoami", derived) == 200 and status("POST", "/v1/grants", derived) == 201
    assert status("GET", "/v1/whoami", chained) == 200 and status("POST", "/v1/grants", chained) == 201
    middle_jti = jwt.decode(middle, options={"verify_signature": False})["jti"]
    r = env.call("POST", f"/v1/tokens/{middle_jti}/revoke", "admin", json={"reason": "stolen session"})
    assert r.status_code == 200, r.text
    assert status("GET", "/v1/whoami", chained) == 401 and status("POST", "/v1/grants", chained) == 401
    assert status("GET", "/v1/whoami", derived) == 200, "only the tokens made from the revoked one end"
    r = env.call("POST", f"/v1/tokens/{jti}/revoke", "admin", json={"reason": "stolen"})
    assert r.status_code == 200, r.text
    assert status("GET", "/v1/whoami", derived) == 401 and status("POST", "/v1/grants", derived) == 401
    assert status("GET", "/v1/whoami", minted("f" * 32)) == 401
