"""The console's pages over answers the API computes in the background (api/computing.py): after a
grant change the impact report and the flow matrix say they are being computed (and ask again by
themselves) instead of showing what was true before; then they show the change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import Env, seeded_env
from tests.api.test_impact_cache import candidate
from tests.console.conftest import sign_in, when_ready

REQUEST = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
           "ttl_seconds": 3600}
FRAGMENT = {"hx-request": "true"}


@pytest.fixture
def cenv(tmp_path: Path) -> Iterator[Env]:
    with seeded_env(tmp_path / "home") as env:
        try:
            yield env
        finally:
            env.app.state.impacts.stop_background()
            env.app.state.flow_sets.stop_background()
            assert env.app.state.impacts.wait_started(120) and env.app.state.flow_sets.wait_started(120)


def approve_a_grant(env: Env) -> None:
    grant = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=REQUEST).json()
    r = env.call("POST", f"/v1/grants/{grant['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 200, r.text


def unchanged_of(html: str) -> int:
    found = re.search(r"(\d+) unchanged", html)
    assert found is not None, html
    return int(found.group(1))


def test_the_impact_fragment_and_the_matrix_say_computing_after_a_grant_change(cenv: Env) -> None:
    env = cenv
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": candidate(), "note": "no platform"})
    assert r.status_code == 201, r.text
    url = f"/console/policy/versions/{r.json()['number']}/impact"
    client = sign_in(env, "security")
    r = client.get(url, headers=FRAGMENT)
    assert r.status_code == 202 and "Opens" not in r.text
    assert f'hx-get="{url}"' in r.text and 'hx-trigger="load delay:1s"' in r.text and 'hx-swap="outerHTML"' in r.text
    first = when_ready(env, client, url, headers=FRAGMENT)
    assert first.status_code == 200 and "Opens 0 flows, closes" in first.text
    matrix = when_ready(env, client, "/console/flows")
    assert matrix.status_code == 200 and 'aria-label="1 flows from acme to globex"' not in matrix.text

    approve_a_grant(env)  # acme/web -> globex/api:8443: open under both versions
    r = client.get("/console/flows")
    assert r.status_code == 202 and 'http-equiv="refresh" content="1"' in r.text and "from \\ to" not in r.text
    r = client.get(url, headers=FRAGMENT)
    assert r.status_code == 202 and "Opens" not in r.text, "never the report from before the grant"
    after = when_ready(env, client, url, headers=FRAGMENT)
    assert after.status_code == 200 and unchanged_of(after.text) == unchanged_of(first.text) + 1
    matrix = when_ready(env, client, "/console/flows")
    assert matrix.status_code == 200 and 'aria-label="1 flows from acme to globex"' in matrix.text
