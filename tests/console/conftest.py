"""Console test harness: the real app (tests/api/conftest.py's environment: real database, key store, trust
domain, shipped policy) and people signed in through the console's own sign-in form."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.console.session import SESSION_COOKIE
from tests.api.conftest import Env, make_settings, open_env, seed, seeded_env

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"


def hidden(html: str, name: str) -> str:
    """The value of a hidden form field, as a browser would submit it."""
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, f"no {name} field in the page"
    return found.group(1)


def sign_in(env: Env, role: str, tenant: str | None = None, *, base_url: str = "http://testserver",
            ttl: timedelta = timedelta(hours=2)) -> TestClient:
    """A browser-like client signed in through the sign-in form with a fresh API token of that principal."""
    client = TestClient(env.app, base_url=base_url, raise_server_exceptions=False, follow_redirects=False)
    page = client.get("/console/login")
    r = client.post("/console/login", data={"token": env.token(role, tenant, ttl=ttl),
                                            "login_token": hidden(page.text, "login_token")})
    assert r.status_code == 303, r.text
    assert client.cookies.get(SESSION_COOKIE), "no session cookie"
    return client


def csrf_of(client: TestClient, page: str = "/console/grants") -> str:
    r = client.get(page)
    assert r.status_code == 200, r.text
    return hidden(r.text, "csrf")


def when_ready(env: Env, client: TestClient, page: str, **kw: Any) -> Any:
    """A page whose data the API computes in the background (the flow matrix, an impact report): its
    'computing' answer (202, which refreshes itself) first when the data changed, then, once the app's
    background work is done, the page itself."""
    r = client.get(page, **kw)
    if r.status_code == 202:
        asks_again = 'hx-trigger="load delay:1s"' if "hx-request" in kw.get("headers", {}) else 'http-equiv="refresh"'
        assert "updates by itself" in r.text and asks_again in r.text, r.text
        state = env.app.state
        assert state.flow_sets.wait_started(120) and state.impacts.wait_started(120)
        r = client.get(page, **kw)
    return r


@pytest.fixture(scope="module")
def console_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One seeded environment for a module's read-mostly tests."""
    with seeded_env(Path(tmp_path_factory.mktemp("console")) / "home") as env:
        yield env


# The browser (one Debian chromium per test session) is tests/conftest.py's `browser`: the console's browser
# tests and the API's /docs test share it (two Playwright instances in one process would clash).


@dataclass
class LiveServer:
    env: Env
    url: str


@contextlib.contextmanager
def serving(env: Env) -> Iterator[LiveServer]:
    """`env`'s app served by uvicorn on 127.0.0.1 and a free port, in a thread, for the block."""
    from tests.conftest import _free_port
    from tests.servers import serve_app

    with serve_app(env.app, _free_port()) as url:
        yield LiveServer(env, url)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The app served on 127.0.0.1: what the browser talks to."""
    home = Path(tmp_path_factory.mktemp("console-live")) / "home"
    env = open_env(make_settings(home, audit_checkpoint_every=1))  # a fresh checkpoint covers every event
    seed(env)
    try:
        with serving(env) as server:
            yield server
    finally:
        env.client.close()
        env.ctx.close()
