"""The engine choice lives in policy.engines.make_engine, and the OPA-server engine is selectable by
configuration end to end: settings -> the API's grant decisions and authorization go over HTTP to a real
OPA-compatible server (`trustfabric pdp`, served here on loopback), failing closed when it is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.errors import InvalidInput
from policy.engines import EngineSettings, make_engine
from policy.engines.embedded import RegorusEngine
from policy.engines.opa_server import OpaServerEngine
from tests.api.conftest import make_settings, open_env, seed
from tests.policy.conftest import serve_pdp
from workflows.settings import Settings

GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
         "ttl_seconds": 3600}


def test_settings_choose_the_engine_per_role() -> None:
    settings = Settings.from_env({"TRUSTFABRIC_POLICY_ENGINE": "opa", "TRUSTFABRIC_OPA_URL": "http://127.0.0.1:9"})
    grants = make_engine(settings.engines(), "grants")
    authz = make_engine(settings.engines(), "authz")
    try:
        assert isinstance(grants, OpaServerEngine) and grants.settings.prefix == "trustfabric/grants"
        assert grants.settings.url == "http://127.0.0.1:9"
        assert isinstance(authz, RegorusEngine)  # the API's own policy stays embedded unless asked
    finally:
        grants.close()
        authz.close()
    assert isinstance(make_engine(Settings.from_env({}).engines(), "grants"), RegorusEngine)
    with pytest.raises(InvalidInput, match="unknown policy engine 'rego'"):
        make_engine(EngineSettings(kind="rego"), "pdp")


def _pdp_modules(served: Any) -> dict[str, str]:
    return dict(served.server.config.app.state.engine.modules())


def test_grant_decisions_over_a_configured_opa_server_and_fail_closed_without_it(tmp_path: Path) -> None:
    served = serve_pdp(token="opa-secret")
    env = open_env(make_settings(tmp_path / "home", policy_engine="opa", opa_url=served.url, opa_token="opa-secret"))
    try:
        seed(env)
        r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=GRANT)
        assert r.status_code == 201, r.text
        assert r.json()["state"] == "pending" and r.json()["pending_approvers"] == ["tenant-admin:globex"]
        held = _pdp_modules(served)
        assert "trustfabric/grants/grants.rego" in held and not any(m.startswith("trustfabric/authz/") for m in held)
        served.stop()
        r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**GRANT, "ports": [8443]})
        assert r.status_code == 201 and r.json()["state"] == "denied", r.text
        assert any("engine-error" in reason for reason in r.json()["reasons"]), r.json()["reasons"]
    finally:
        served.stop()
        env.client.close()
        env.ctx.close()


def test_api_authorization_over_a_configured_opa_server(tmp_path: Path) -> None:
    served = serve_pdp()
    env = open_env(make_settings(tmp_path / "home", authz_engine="opa", opa_url=served.url))
    try:
        seed(env, policy=False)
        assert env.call("GET", "/v1/tenants", "admin").status_code == 200
        assert env.call("POST", "/v1/tenants", "auditor", json={"slug": "x", "display_name": "X"}).status_code == 403
        assert set(_pdp_modules(served)) == {"trustfabric/authz/api_authz.rego"}
    finally:
        served.stop()
        env.client.close()
        env.ctx.close()
