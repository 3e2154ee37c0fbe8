"""Console sessions: the cookie's flags, what it carries (an API JWT minted for exactly the signed-in
principal, never the typed credential), its expiry, sign-out revoking it, the sign-in form's own CSRF
check, and no server-side state (a second app over the same database accepts the session)."""

from __future__ import annotations

from datetime import timedelta

import jwt
from fastapi.testclient import TestClient
from sqlmodel import select

from api.app import create_app
from api.console.session import LOGIN_COOKIE, SESSION_COOKIE, SESSION_NOTE
from audit.models import AuditEvent
from pki.tokens.models import ApiToken
from pki.tokens.service import opaque_token
from tests.api.conftest import Env, admin_opaque
from tests.console.conftest import hidden, sign_in


def _login(env: Env, token: str, base_url: str = "http://testserver", **headers: str) -> tuple[TestClient, object]:
    client = TestClient(env.app, base_url=base_url, raise_server_exceptions=False, follow_redirects=False)
    page = client.get("/console/login")
    r = client.post("/console/login", data={"token": token, "login_token": hidden(page.text, "login_token")},
                    headers=headers)
    return client, r


def _cookie_header(response: object, name: str) -> str:
    headers = response.headers.get_list("set-cookie")  # type: ignore[attr-defined]
    found = [h for h in headers if h.startswith(f"{name}=")]
    assert found, f"no Set-Cookie for {name}: {headers}"
    return str(found[0])


def test_cookie_flags_plain_http_and_tls(console_env: Env) -> None:
    for base, secure in (("http://testserver", False), ("https://testserver", True)):
        _client, r = _login(console_env, console_env.token("auditor"), base)
        assert r.status_code == 303  # type: ignore[attr-defined]
        cookie = _cookie_header(r, SESSION_COOKIE).lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
        assert ("secure" in cookie.split("; ")) is secure, cookie
        assert "max-age=" in cookie


def test_the_session_is_a_fresh_token_for_exactly_that_principal(console_env: Env) -> None:
    env = console_env
    typed = env.token("tenant-admin", "acme", ttl=timedelta(minutes=20), subject="alice@acme")
    client, _r = _login(env, typed)
    session = client.cookies[SESSION_COOKIE]
    assert session != typed
    claims = jwt.decode(session, options={"verify_signature": False})
    original = jwt.decode(typed, options={"verify_signature": False})
    assert (claims["sub"], claims["role"], claims["tenant"]) == ("alice@acme", "tenant-admin", "acme")
    assert claims["exp"] <= original["exp"], "a session never outlives the credential it came from"
    assert claims["jti"] != original["jti"]
    page = client.get("/console/grants")
    assert typed not in page.text and session not in page.text, "no credential in a page"
    with env.ctx.db.read_session() as s:
        row = s.get(ApiToken, claims["jti"])
        assert row is not None and row.description == SESSION_NOTE and row.subject == "alice@acme"
        event = s.exec(select(AuditEvent).where(AuditEvent.object_id == claims["jti"])).one()
        assert (event.action, event.actor_id) == ("token.create", "alice@acme")


def test_the_session_lasts_no_longer_than_the_configured_ttl(console_env: Env) -> None:
    env = console_env
    client, _r = _login(env, admin_opaque(env))  # the bootstrap kind of token: opaque, no expiry
    claims = jwt.decode(client.cookies[SESSION_COOKIE], options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] <= env.ctx.settings.console_session_ttl.total_seconds()
    assert claims["role"] == "admin" and client.cookies[SESSION_COOKIE].count(".") == 2


def test_sign_out_revokes_the_session_everywhere(console_env: Env) -> None:
    env = console_env
    client = sign_in(env, "security")
    stolen = client.cookies[SESSION_COOKIE]
    csrf = hidden(client.get("/console/policy").text, "csrf")
    r = client.post("/console/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/console/login?notice=signed-out"
    assert 'tf_console=""' in _cookie_header(r, SESSION_COOKIE) or "max-age=0" in _cookie_header(r, SESSION_COOKIE)
    replay = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False,
                        cookies={SESSION_COOKIE: stolen})
    r = replay.get("/console/policy")
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login")
    jti = jwt.decode(stolen, options={"verify_signature": False})["jti"]
    with env.ctx.db.read_session() as s:
        assert s.get(ApiToken, jti).revoked_at is not None  # type: ignore[union-attr]


def test_an_expired_session_signs_the_person_out(console_env: Env) -> None:
    env = console_env
    client = sign_in(env, "auditor", ttl=timedelta(minutes=5))
    assert client.get("/console/audit").status_code == 200
    env.clock.advance(timedelta(minutes=6))
    try:
        r = client.get("/console/audit")
        assert r.status_code == 303 and r.headers["location"] == "/console/login?next=%2Fconsole%2Faudit"
    finally:
        env.clock.advance(-timedelta(minutes=6))


def test_sessions_need_no_server_state(console_env: Env) -> None:
    """Another app over the same database and keys (another worker or replica) serves the same session."""
    client = sign_in(console_env, "tenant-admin", "globex")
    other = TestClient(create_app(console_env.ctx), raise_server_exceptions=False, follow_redirects=False,
                       cookies={SESSION_COOKIE: client.cookies[SESSION_COOKIE]})
    r = other.get("/console/tenants/globex")
    assert r.status_code == 200 and "spiffe://example.org/tenant/globex/group/api/api-1" in r.text


def test_sign_in_form_refuses_cross_site_and_stale_posts(console_env: Env) -> None:
    env = console_env
    token = env.token("auditor")
    bare = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)
    r = bare.post("/console/login", data={"token": token, "login_token": "guess"})
    assert r.status_code == 403 and f"{SESSION_COOKIE}=" not in r.headers.get("set-cookie", "")
    _client, r = _login(env, token, **{"Origin": "https://evil.example"})
    assert r.status_code == 403  # type: ignore[attr-defined]
    _client, r = _login(env, token, **{"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403  # type: ignore[attr-defined]
    cookie = _cookie_header(bare.get("/console/login"), LOGIN_COOKIE).lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_bad_credentials_and_identities_that_are_not_people(console_env: Env) -> None:
    env = console_env
    _client, r = _login(env, "tfo_nope_nope")
    assert r.status_code == 401 and "the API refused this credential" in r.text  # type: ignore[attr-defined]
    # something pasted that is no token at all: said so, not PyJWT's "malformed bearer token: Not enough segments"
    _client, r = _login(env, "copied-the-wrong-line")
    text = r.text  # type: ignore[attr-defined]
    assert r.status_code == 401 and "it is not an API token" in text and "segments" not in text, text  # type: ignore[attr-defined]
    _client, r = _login(env, env.token("auditor", ttl=timedelta(seconds=10)))
    assert r.status_code == 401 and "less than 30 seconds" in r.text  # type: ignore[attr-defined]
    from pki.service import issue_jwt_svid

    with env.ctx.db.session() as s:
        from audit import Actor

        svid = issue_jwt_svid(s, env.ctx.keystore, tenant="acme", group="web", workload="web-1",
                              audience=["trustfabric-api"], ttl=None, actor=Actor.system("t"), scope_tenant=None,
                              clock=env.clock)
    _client, r = _login(env, svid.token)
    assert r.status_code == 401 and "workload identity cannot use the console" in r.text  # type: ignore[attr-defined]


def test_next_only_leads_inside_the_console(console_env: Env) -> None:
    env = console_env
    for target, expected in (("/console/audit", "/console/audit"), ("https://evil.example/", "/console/"),
                             ("//evil.example/console/", "/console/")):
        client = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)
        page = client.get("/console/login")
        r = client.post("/console/login", data={"token": env.token("auditor"), "next": target,
                                                "login_token": hidden(page.text, "login_token")})
        assert r.headers["location"] == expected


def _revoke(env: Env, token_id: str) -> None:
    r = env.call("POST", f"/v1/tokens/{token_id}/revoke", "admin", json={"reason": "stolen"})
    assert r.status_code == 200, r.text


def _session_works(env: Env, session: str) -> bool:
    """Whether the session opens a console page, and whether its cookie's JWT is still a bearer token."""
    page = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False,
                      cookies={SESSION_COOKIE: session}).get("/console/audit")
    bearer = TestClient(env.app, raise_server_exceptions=False).get(
        "/v1/whoami", headers={"Authorization": f"Bearer {session}"})
    assert (page.status_code == 200) == (bearer.status_code == 200), (page.status_code, bearer.text)
    if page.status_code != 200:
        assert page.status_code == 303 and page.headers["location"].startswith("/console/login"), page.text
        assert "revoked" in bearer.json()["reason"], bearer.text
    return bool(page.status_code == 200)


def test_revoking_the_jwt_signed_in_with_ends_its_sessions(console_env: Env) -> None:
    """A stolen API token revoked by an admin left every console session opened with it alive until its own expiry
    (up to TRUSTFABRIC_CONSOLE_SESSION_SECONDS), as a cookie and as a bearer token: the session is a fresh token."""
    env = console_env
    typed = env.token("auditor", ttl=timedelta(hours=2))
    client, r = _login(env, typed)
    session = client.cookies[SESSION_COOKIE]
    assert r.status_code == 303 and _session_works(env, session)  # type: ignore[attr-defined]
    _revoke(env, jwt.decode(typed, options={"verify_signature": False})["jti"])
    assert not _session_works(env, session)


def test_revoking_the_opaque_token_signed_in_with_ends_its_sessions(console_env: Env) -> None:
    env = console_env
    typed = admin_opaque(env)
    client, r = _login(env, typed)
    session = client.cookies[SESSION_COOKIE]
    assert r.status_code == 303 and _session_works(env, session)  # type: ignore[attr-defined]
    with env.ctx.db.read_session() as s:
        token_id = opaque_token(s, typed).id
    _revoke(env, token_id)
    assert not _session_works(env, session)


def test_a_session_opened_with_a_session_ends_with_the_first_credential(console_env: Env) -> None:
    """Pasting a session's JWT into the sign-in form makes another session: it too ends with the credential the
    first one came from (not only with the first session)."""
    env = console_env
    typed = env.token("security", ttl=timedelta(hours=2))
    first, _r = _login(env, typed)
    second, r = _login(env, first.cookies[SESSION_COOKIE])
    sessions = [first.cookies[SESSION_COOKIE], second.cookies[SESSION_COOKIE]]
    assert r.status_code == 303 and all(_session_works(env, s) for s in sessions)  # type: ignore[attr-defined]
    _revoke(env, jwt.decode(typed, options={"verify_signature": False})["jti"])
    assert not any(_session_works(env, s) for s in sessions)


def test_a_session_opened_with_a_session_ends_with_that_session(console_env: Env) -> None:
    """Revoking (or signing out of) the session a second one was opened with ends the second as well: the second
    named only the first credential, so a stolen session cookie pasted into the sign-in form outlived the admin's
    revocation of that session (and the owner's sign-out) until the credential itself was revoked."""
    env = console_env
    typed = env.token("security", ttl=timedelta(hours=2))
    first, _r = _login(env, typed)
    second, r = _login(env, first.cookies[SESSION_COOKIE])
    assert r.status_code == 303 and _session_works(env, second.cookies[SESSION_COOKIE])  # type: ignore[attr-defined]
    _revoke(env, jwt.decode(first.cookies[SESSION_COOKIE], options={"verify_signature": False})["jti"])
    assert not _session_works(env, second.cookies[SESSION_COOKIE])
    assert _session_works(env, _login(env, typed)[0].cookies[SESSION_COOKIE]), "the credential itself still works"


def test_a_chain_of_sessions_is_bounded(console_env: Env) -> None:
    """Each session names every token it stands in for (checked on every request): eight deep at most; the ninth
    sign-in is refused on the sign-in page, asking for the API token itself."""
    env = console_env
    credential = env.token("auditor", ttl=timedelta(hours=2))
    for _ in range(8):
        client, r = _login(env, credential)
        assert r.status_code == 303, r.text  # type: ignore[attr-defined]
        credential = client.cookies[SESSION_COOKIE]
    _client, r = _login(env, credential)
    assert r.status_code == 401 and "sign in with the API token itself" in r.text  # type: ignore[attr-defined]
    assert _session_works(env, credential), "the last session still works"
