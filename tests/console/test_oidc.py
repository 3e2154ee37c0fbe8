"""Sign-in through an OIDC issuer: the authorization code flow with PKCE against a real provider (Authlib's
authorization server, tests/console/oidc_provider.py) that this test starts on 127.0.0.1."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import jwt
import pytest
from fastapi.testclient import TestClient

from api.console.oidc import FLOW_COOKIE
from api.console.session import SESSION_COOKIE
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.console.oidc_provider import CLIENT_ID, OidcProvider, User, random_user, running

CALLBACK = "http://testserver/console/oidc/callback"
ALICE = random_user("tenant-admin", "acme")
AUDITOR = random_user("auditor")
NOBODY = User("nobody@example.org", {"trustfabric_role": "node"})


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, OidcProvider]]:
    with running([ALICE, AUDITOR, NOBODY], [CALLBACK]) as provider:
        settings = make_settings(Path(tmp_path_factory.mktemp("oidc")) / "home")
        settings = replace(settings, oidc_issuer=provider.issuer, oidc_jwks=f"{provider.issuer}/jwks",
                           oidc_client_id=CLIENT_ID)
        env = open_env(settings)
        seed(env)
        yield env, provider
        env.client.close()
        env.ctx.close()


def _browser(env: Env) -> TestClient:
    return TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)


def _authorize(client: TestClient, user: str) -> tuple[str, dict[str, str]]:
    """Start at the console, sign in at the provider's form as `user`; (callback URL, authorize params)."""
    r = client.get("/console/oidc/start")
    assert r.status_code == 303, r.text
    authorize = r.headers["location"]
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(authorize).query))
    with httpx.Client(timeout=10) as web:
        form = web.get(authorize)
        assert form.status_code == 200 and "Sign in to the test provider" in form.text, form.text
        answer = web.post(authorize, data={"sub": user})
    assert answer.status_code == 302, answer.text
    return answer.headers["location"], params


def _local(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.path}?{parts.query}"


def test_code_flow_with_pkce_signs_the_person_in(idp: tuple[Env, OidcProvider]) -> None:
    env, provider = idp
    client = _browser(env)
    callback, params = _authorize(client, ALICE.sub)
    assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) == 43
    assert params["client_id"] == CLIENT_ID and params["redirect_uri"] == CALLBACK and params["nonce"]
    flow_cookie = next(c for c in client.cookies.jar if c.name == FLOW_COOKIE)
    assert flow_cookie.path == "/console/oidc" and flow_cookie.has_nonstandard_attr("HttpOnly")
    r = client.get(_local(callback))
    assert r.status_code == 200 and 'http-equiv="refresh"' in r.text, r.text
    set_cookie = "; ".join(r.headers.get_list("set-cookie")).lower()
    assert "samesite=strict" in set_cookie and "httponly" in set_cookie
    exchange = provider.token_requests[-1]
    assert exchange["grant_type"] == "authorization_code" and len(exchange["code_verifier"]) >= 43
    assert "client_secret" not in exchange
    page = client.get("/console/tenants/acme")
    assert page.status_code == 200 and f"oidc:{ALICE.sub}" in page.text and "tenant-admin" in page.text
    claims = jwt.decode(client.cookies[SESSION_COOKIE], options={"verify_signature": False})
    assert (claims["sub"], claims["role"], claims["tenant"]) == (f"oidc:{ALICE.sub}", "tenant-admin", "acme")
    assert client.get("/console/tenants/globex").status_code in (403, 404), "the IdP's tenant claim scopes it"


def test_the_provider_refuses_the_code_without_the_right_verifier(idp: tuple[Env, OidcProvider]) -> None:
    """PKCE is enforced by the peer: a stolen code is useless without the verifier only our cookie holds."""
    env, provider = idp
    client = _browser(env)
    callback, _params = _authorize(client, AUDITOR.sub)
    code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(callback).query))["code"]
    stolen = httpx.post(f"{provider.issuer}/token", data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": CLIENT_ID,
        "code_verifier": "x" * 64})
    assert stolen.status_code == 400 and stolen.json()["error"] in ("invalid_grant", "invalid_request")
    r = client.get(_local(callback))
    assert r.status_code == 200 and client.get("/console/audit").status_code == 200


def test_a_callback_that_is_not_this_sign_ins_is_refused(idp: tuple[Env, OidcProvider]) -> None:
    env, _provider = idp
    client = _browser(env)
    callback, _params = _authorize(client, ALICE.sub)
    forged = callback.replace("state=", "state=x")
    r = client.get(_local(forged))
    assert r.status_code == 401 and "state mismatch" in r.text and not client.cookies.get(SESSION_COOKIE)
    stranger = _browser(env)  # the same answer in another browser (no flow cookie)
    r = stranger.get(_local(callback))
    assert r.status_code == 401 and "start again" in r.text
    flow = client.cookies.get(FLOW_COOKIE) or ""
    tampered = _browser(env)
    tampered.cookies.set(FLOW_COOKIE, flow[:-4] + "AAAA", path="/console/oidc")
    r = tampered.get(_local(callback))
    assert r.status_code == 401 and "invalid or expired" in r.text
    r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {flow}"})
    assert r.status_code == 401, "the flow cookie is no API credential"


def test_an_identity_the_api_will_not_map_is_refused(idp: tuple[Env, OidcProvider]) -> None:
    env, _provider = idp
    client = _browser(env)
    callback, _params = _authorize(client, NOBODY.sub)
    r = client.get(_local(callback))
    assert r.status_code == 401 and "the API refused this credential" in r.text


def test_without_an_issuer_the_console_offers_tokens_only(console_env: Env) -> None:
    client = _browser(console_env)
    assert "/console/oidc/start" not in client.get("/console/login").text
    assert client.get("/console/oidc/start").status_code == 404
