"""api/handoff.py: every `def` route taking the principal checks its token in its own hand-off to a worker thread,
never on the event loop, and answers as it did when the principal was a dependency resolved on the loop: 401
before 422, the principal's 429, the same OpenAPI document (the principal never a parameter)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jwt
import pytest
from fastapi.routing import APIRoute

from api.app import ROUTERS
from api.deps import AUTHENTICATED_IN_THREAD, PrincipalDep, current_principal
from api.handoff import handed_off
from tests.api.conftest import Env
from tests.api.test_mtls import new_csr

# `async def` routes that take the principal as a dependency, so check its token on the loop: each a choice
# (GET /v1/grants answers its cached pages on the loop, its page read there too), not an oversight
LOOP_AUTHENTICATED = {"list_grants"}


def _calls(dependant: Any) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def test_no_sync_route_resolves_the_principal_on_the_loop() -> None:
    """Every API route whose dependencies include `current_principal` is `async def` and named in
    LOOP_AUTHENTICATED; every other one that authenticates runs as a hand-off (`tf_endpoint`: its sync function)
    marked to authenticate first when its request is invalid. A router built without HandedOffRoute fails here."""
    on_loop, handed = set(), 0
    for router in ROUTERS:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            if current_principal in set(_calls(route.dependant)):
                assert inspect.iscoroutinefunction(route.endpoint), route.path
                on_loop.add(route.endpoint.__name__)
            if hasattr(route.endpoint, "tf_endpoint"):
                assert route.endpoint in AUTHENTICATED_IN_THREAD, route.path
                assert not inspect.iscoroutinefunction(route.endpoint.tf_endpoint), route.path
                handed += 1
    assert on_loop == LOOP_AUTHENTICATED
    assert handed > 50  # nearly every authenticated route


def test_an_endpoint_without_the_principal_or_already_async_is_left_as_it_is() -> None:
    def healthz() -> dict[str, str]:
        return {}

    async def read(principal: PrincipalDep) -> None:
        return None

    def stream(principal: PrincipalDep) -> Iterator[bytes]:
        yield b""

    for endpoint in (healthz, read, stream):
        assert handed_off(endpoint) is endpoint


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def recorded(env: Env) -> Iterator[list[bool]]:
    """Per authenticator call (the token's row read): whether it ran on a thread running an event loop."""
    seen: list[bool] = []
    authenticators = env.app.state.authenticators

    def recording(ctx: Any, req: Any, inner: Any) -> Any:
        seen.append(_on_loop())
        return inner(ctx, req)

    env.app.state.authenticators = [lambda c, r, a=a: recording(c, r, a) for a in authenticators]
    try:
        yield seen
    finally:
        env.app.state.authenticators = authenticators


def test_routes_check_their_token_off_the_event_loop(env: Env, recorded: list[bool]) -> None:
    """An SVID renewal (the fleet's most frequent request), a read, a route taking no Request of its own
    (whoami), approvals and a 404: each authenticated once, in its worker thread. GET /v1/grants, an async
    route, still checks on the loop: the recorder can tell them apart."""
    _, csr = new_csr()
    r = env.call("POST", "/v1/svids/x509", "tenant-admin", "acme",
                 json={"csr": csr.decode(), "tenant": "acme", "group": "web", "workload": "web-1"})
    assert r.status_code == 201, r.text
    assert env.call("GET", "/v1/tenants", "admin").status_code == 200
    assert env.call("GET", "/v1/whoami", "tenant-admin", "acme").json()["tenant"] == "acme"
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme",
                 json={"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp",
                       "ports": [443], "ttl_seconds": 3600, "justification": "t"})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    r = env.call("POST", f"/v1/grants/{r.json()['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 200 and r.json()["state"] == "active", r.text
    assert env.call("GET", "/v1/grants/nothing-here", "admin").status_code == 404
    assert env.call("GET", "/v1/devices/nic:gpu9/ruleset", "admin").status_code == 404  # async: its own hand-off
    assert env.call("GET", "/metrics", "admin").status_code == 200  # async: its one hand-off
    assert recorded and not any(recorded), recorded  # each authenticator tried (the mTLS one, the token one)
    recorded.clear()
    assert env.call("GET", "/v1/grants", "tenant-admin", "acme").status_code == 200
    assert recorded and all(recorded)


def test_an_invalid_renewal_is_refused_for_its_credentials_first(env: Env) -> None:
    """POST /v1/svids/x509 and POST /v1/nodes/renew validate their body on the loop and check the token in their
    worker thread (GET /v1/devices/{device}/ruleset: its query); an invalid request is still answered 401 without
    a token, with a bad or a revoked one (nothing written), and 422 with the reason only for an authenticated
    caller."""
    from audit import Actor
    from pki.tokens.service import revoke_token

    invalid = {"csr": "", "tenant": "acme", "group": "web", "workload": "web-1"}
    for path in ("/v1/svids/x509", "/v1/nodes/renew"):
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            r = env.client.post(path, json=invalid, headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthenticated", (path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    r = env.call("POST", "/v1/svids/x509", "tenant-admin", "acme", json=invalid)
    assert r.status_code == 422 and r.json()["reason"].startswith("body.csr"), r.text
    # a device's long-poll (async, authenticated in its own hand-off too): the same order
    assert env.client.get("/v1/devices/nic:gpu1/ruleset?wait=-1").status_code == 401
    r = env.call("GET", "/v1/devices/nic:gpu1/ruleset?wait=-1", "admin")
    assert r.status_code == 422 and "wait" in r.json()["reason"], r.text
    token = env.token("tenant-admin", "acme")
    with env.ctx.db.session() as s:
        revoke_token(s, jwt.decode(token, options={"verify_signature": False})["jti"], actor=Actor.system("t"),
                     reason="test", clock=env.clock)
    for body in (invalid, {**invalid, "csr": new_csr()[1].decode()}):
        r = env.client.post("/v1/svids/x509", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401 and r.json()["reason"] == "token revoked", r.text
