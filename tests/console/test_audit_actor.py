"""The console's audit pages name an actor with its tenant (`alice@acme`), link to that actor's events only, and
its own session acts as the signed-in principal of its tenant."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from api.console.session import SESSION_COOKIE
from tests.api.conftest import Env, seeded_env
from tests.console.conftest import hidden, sign_in


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with seeded_env(tmp_path / "home") as e:
        yield e


def _alice_signs_in(env: Env, tenant: str) -> TestClient:
    """acme's or globex's tenant-admin `alice` (one token subject in both) signs in to the console."""
    client = TestClient(env.app, raise_server_exceptions=False, follow_redirects=False)
    page = client.get("/console/login")
    token = env.token("tenant-admin", tenant, subject="alice")
    r = client.post("/console/login", data={"token": token, "login_token": hidden(page.text, "login_token")})
    assert r.status_code == 303 and client.cookies.get(SESSION_COOKIE), r.text
    return client


def _seqs(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'<td><a href="/console/audit/events/(\d+)">', page)]


def test_the_audit_pages_tell_two_tenants_alice_apart(env: Env) -> None:
    for tenant in ("acme", "globex"):
        _alice_signs_in(env, tenant)  # the console mints her session token: a token.create by her
    auditor = sign_in(env, "auditor")
    items = env.call("GET", "/v1/audit/events", "auditor", params={"action": "token.create", "limit": 1000}
                     ).json()["items"]
    sessions = [e for e in items if e["actor"]["id"] == "alice"]
    assert [e["actor"].get("tenant") for e in sessions] == ["acme", "globex"]

    r = auditor.get("/console/audit", params={"action": "token.create"})
    assert r.status_code == 200
    page = html.unescape(r.text)
    for tenant in ("acme", "globex"):
        assert f'href="/console/audit?actor={quote(f"alice@{tenant}", safe="")}"' in page
        assert f">alice@{tenant}</a>" in page
    r = auditor.get("/console/audit", params={"actor": "alice@globex"})
    assert r.status_code == 200 and _seqs(r.text) == [sessions[1]["seq"]], "globex's alice only"
    r = auditor.get("/console/audit", params={"actor": "alice"})
    assert _seqs(r.text) == [e["seq"] for e in sessions], "a plain id: every tenant's"

    r = auditor.get(f"/console/audit/events/{sessions[1]['seq']}")
    assert r.status_code == 200
    assert "<dd>alice@globex (tenant)</dd>" in r.text and 'class="badge ok">verified' in r.text, r.text
    platform = items[0]  # init's own: an actor of no tenant, shown and checked as before
    r = auditor.get(f"/console/audit/events/{platform['seq']}")
    assert f"<dd>{platform['actor']['id']} ({platform['actor']['kind']})</dd>" in r.text
    assert 'class="badge ok">verified' in r.text
