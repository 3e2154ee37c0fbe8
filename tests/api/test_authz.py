"""Authorization fails closed at the API: no engine, an engine that cannot load, an engine error or a
broken api_authz policy -> 403 with the reason, logged; an error is never cached as an answer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.authz import default_engine_factory
from policy.engines.embedded import RegorusEngine
from policy.errors import PolicyEngineError
from tests.api.conftest import Env, make_settings, open_env, seed


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = open_env(make_settings(tmp_path / "home"))
    seed(e, policy=False)
    yield e
    e.client.close()
    e.ctx.close()


class Flaky:
    """An engine that fails until told otherwise, then answers like the shipped policy."""

    def __init__(self) -> None:
        self.broken = True
        self.real = default_engine_factory()

    def evaluate(self, query: str, input: Any = None) -> Any:
        if self.broken:
            raise PolicyEngineError("evaluating data.api_authz.decision: server unreachable")
        return self.real.evaluate(query, input)

    def modules(self) -> dict[str, str]:
        return self.real.modules()  # type: ignore[attr-defined, no-any-return]


def _get(env: Env, app: Any, path: str = "/v1/grants") -> Any:
    with TestClient(app, raise_server_exceptions=False) as client:
        return client.get(path, headers=env.headers("admin"))


def test_no_engine_and_an_engine_that_cannot_load_deny(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    r = _get(env, create_app(env.ctx, authz_engine_factory=None))
    assert r.status_code == 403 and "authorization policy unavailable" in r.json()["reason"]

    def boom() -> Any:
        raise OSError("rego/api_authz.rego: no such file")

    with caplog.at_level(logging.ERROR, logger="trustfabric.api.authz"):
        r = _get(env, create_app(env.ctx, authz_engine_factory=boom))
    assert r.status_code == 403 and "no such file" in r.json()["reason"]
    assert "cannot load the API authorization policy" in caplog.text


def test_engine_error_denies_with_the_reason_and_is_not_cached(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky()
    app = create_app(env.ctx, authz_engine_factory=lambda: flaky)
    with caplog.at_level(logging.WARNING, logger="policy.decide"):
        r = _get(env, app)
    assert r.status_code == 403 and "engine-error" in r.json()["reason"], r.text
    assert "authz decision denied (fail closed)" in caplog.text
    flaky.broken = False
    assert _get(env, app).status_code == 200  # the failure was not remembered as a deny (nor an allow)


@pytest.mark.parametrize("module", [
    "package api_authz\n\ndecision := {\"allow\": \"yes\", \"reasons\": []}\n",  # malformed answer
    "package api_authz\n\nx := 1\n",  # no decision at all
    "package api_authz\n\ndecision := {\"allow\": true, \"reasons\": []} if to_number(\"x\") > 0\n",  # run-time error
])
def test_a_broken_authz_policy_denies(env: Env, module: str) -> None:
    app = create_app(env.ctx, authz_engine_factory=lambda: RegorusEngine({"api_authz.rego": module}))
    r = _get(env, app)
    assert r.status_code == 403 and r.json()["reason"], r.text


def test_a_tenant_role_refused_a_platform_resource_is_told_so(tmp_path: Path) -> None:
    """The reason names the resource as platform-wide, not as being 'in tenant null'."""
    e = open_env(make_settings(tmp_path / "home"))
    try:
        seed(e)
        r = e.call("GET", "/v1/ca/status", "tenant-admin", "acme")
        assert r.status_code == 403, r.text
        assert "null" not in r.json()["reason"]
        assert "scoped to tenant acme, the resource is platform-wide" in r.json()["reason"], r.text
    finally:
        e.client.close()
        e.ctx.close()
