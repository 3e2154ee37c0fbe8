"""The policy routes through the real app (real tokens, api_authz.rego), the CLI, and `trustfabric pdp`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app
from policy.decide import decide_flow
from policy.engines.opa_server import OpaServerEngine, OpaSettings
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.policy.conftest import free_port
from tests.policy.helpers import REGO_DIR, ROOT, flow, shipped, small_doc
from workflows.context import AppContext


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = open_env(make_settings(tmp_path / "home"))
    seed(e, policy=False)  # these tests upload and activate versions themselves
    yield e
    e.client.close()
    e.ctx.close()


def test_policy_lifecycle_over_http(env: Env) -> None:
    mods = shipped()
    r = env.call("POST", "/v1/policy/validate", "security", json={"modules": mods})
    assert r.status_code == 200, r.text
    bad = env.call("POST", "/v1/policy/versions", "security",
                   json={"modules": {**mods, "flows.rego": mods["flows.rego"] + "\nx := {\n"}})
    assert bad.status_code == 400 and "flows.rego:" in bad.json()["reason"]
    assert env.call("GET", "/v1/policy/versions", "security").json() == []
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": mods, "note": "v1"})
    assert r.status_code == 201 and r.json()["tests_passed"], r.text
    number = r.json()["number"]
    assert env.call("POST", "/v1/policy/versions", "tenant-admin", "acme", json={"modules": mods}).status_code == 403
    imp = env.call("GET", f"/v1/policy/versions/{number}/impact", "security").json()
    assert imp["baseline_hash"] is None and imp["opened_count"] > 0 and imp["closed_count"] == 0
    assert any(f["src_tenant"] == "acme" and f["dst_group"] == "db" for f in imp["opened"])
    denied = env.call("GET", "/v1/policy/explain", "security",
                      params={"src": "acme/web", "dst": "acme/db", "port": 5432})
    assert denied.json()["allow"] is False and denied.json()["reasons"][0].startswith("no-policy:")
    assert env.call("POST", f"/v1/policy/versions/{number}/activate", "auditor", json={}).status_code == 403
    act = env.call("POST", f"/v1/policy/versions/{number}/activate", "security", json={"reason": "go"})
    assert act.status_code == 200 and act.json()["state"] == "active", act.text
    ok = env.call("GET", "/v1/policy/explain", "tenant-member", "acme",
                  params={"src": "acme/web", "dst": "acme/db", "port": 5432})
    assert ok.status_code == 200 and ok.json()["allow"] is True and ok.json()["reasons"][0].startswith("intra-tenant")
    other = env.call("GET", "/v1/policy/explain", "tenant-member", "acme",
                     params={"src": "globex/api", "dst": "globex/vault", "port": 8200})
    assert other.status_code == 403
    assert env.call("GET", "/v1/policy/active", "auditor").json()["number"] == number
    assert env.call("GET", f"/v1/policy/versions/{number}", "auditor").json()["sources"] == mods
    assert env.call("POST", f"/v1/policy/versions/{number}/rollback", "security", json={}).status_code == 409
    assert env.call("GET", "/v1/policy/versions/999", "security").status_code == 404
    logged = env.call("GET", "/v1/policy/decisions", "auditor", params={"kind": "flow"}).json()
    assert [d["allowed"] for d in logged] == [True, False]  # the explains above, newest first
    assert logged[0]["policy_hash"] == act.json()["content_hash"] and logged[1]["policy_hash"] is None
    assert env.call("GET", "/v1/policy/explain", "security",
                    params={"src": "acme", "dst": "acme/db", "port": 1}).status_code == 400


def _cli(env: Env, *args: str) -> tuple[int, str, str]:
    runner = CliRunner()
    result = runner.invoke(cli_app, list(args), env={"TRUSTFABRIC_HOME": str(env.ctx.settings.home)})
    return result.exit_code, result.stdout, result.stderr


def test_cli_policy_commands(env: Env, tmp_path: Path) -> None:
    code, out, _ = _cli(env, "policy", "validate", str(REGO_DIR), "--json")
    assert code == 0 and len(json.loads(out)["content_hash"]) == 64
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.rego").write_text("package a\n\nx := {\n")
    code, _, err = _cli(env, "policy", "validate", str(broken))
    assert code == 1 and err.strip().startswith("error: policy does not compile: a.rego:") and "Traceback" not in err
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "a_test.rego").write_text("package a_test\n\ntest_yes if true\n\ntest_no if false\n")
    code, out, err = _cli(env, "policy", "test", str(failing), "--json")
    assert code == 1 and json.loads(out)["failing"] == ["a_test.test_no"] and "a_test.test_no" in err
    code, out, _ = _cli(env, "policy", "test", str(REGO_DIR))
    assert code == 0
    code, out, _ = _cli(env, "policy", "upload", str(REGO_DIR), "--json")
    assert code == 0 and json.loads(out)["created"]
    code, out, _ = _cli(env, "policy", "impact", "1", "--json", "--limit", "3")
    assert code == 0 and len(json.loads(out)["opened"]) == 3
    code, out, _ = _cli(env, "policy", "activate", "1", "--json")
    assert code == 0 and json.loads(out)["state"] == "active"
    code, out, _ = _cli(env, "policy", "list", "--json")
    assert code == 0 and [v["state"] for v in json.loads(out)] == ["active"]
    code, out, _ = _cli(env, "policy", "show")
    assert code == 0 and "state: active" in out
    code, out, _ = _cli(env, "policy", "explain", "--src", "acme/web", "--dst", "globex/api", "--port", "443")
    assert code == 0 and out.startswith("DENY") and "no-grant:" in out
    code, out, _ = _cli(env, "policy", "explain", "--src", "acme/web", "--dst", "acme/db", "--port", "5432",
                        "--json")
    assert code == 0 and json.loads(out)["allow"] is True
    code, _, err = _cli(env, "policy", "rollback", "1")
    assert code == 1 and err.count("\n") == 1 and "earlier" in err
    code, _, err = _cli(env, "policy", "show", "nope")
    assert code == 1 and err.startswith("error:")
    code, _, _ = _cli(env, "policy", "explain", "--src", "acme/web")
    assert code == 2


def test_trustfabric_pdp_serves_decisions(tmp_path: Path) -> None:
    """The real command in a subprocess, asked through the OPA engine over HTTP."""
    port = free_port()
    envvars = {**os.environ, "TRUSTFABRIC_PDP_TOKEN": "cli-token", "TRUSTFABRIC_HOME": str(tmp_path / "h")}
    proc = subprocess.Popen([sys.executable, "-c", "from cli.main import main; main()", "pdp", "--rego", str(REGO_DIR),
                             "--port", str(port)], cwd=ROOT, env=envvars, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        engine = OpaServerEngine(OpaSettings(url=url, token="cli-token"))
        engine._modules = shipped()  # already served by --rego
        engine.set_data(small_doc())
        assert decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080)).allow
        assert not decide_flow(engine, flow("evil", "bot", "acme", "web", "tcp", 443)).allow
        engine.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_pdp_from_database_follows_the_active_version(tmp_path: Path) -> None:
    from audit import Actor
    from pdp.sync import PdpSync
    from policy import service
    from policy.engines.embedded import RegorusEngine
    from tests.policy.dbutil import populate

    ctx = AppContext.open(make_settings(tmp_path / "home"), create=True)
    try:
        engine = RegorusEngine()
        sync = PdpSync(ctx.db, engine, interval=60)
        sync.run_once()
        assert not decide_flow(engine, flow("acme", "web", "acme", "db", "tcp", 5432)).allow
        with ctx.db.session() as s:
            populate(s, ctx.clock())
            service.upload(s, shipped(), Actor("sec", "security"), now=ctx.clock())
            service.activate(s, 1, Actor("sec", "security"), now=ctx.clock())
        sync.run_once()
        assert sync.active_hash is not None
        assert decide_flow(engine, flow("acme", "web", "acme", "db", "tcp", 5432)).allow
        assert decide_flow(engine, flow("acme", "web", "globex", "api", "tcp", 8443)).allow  # grant `live`
    finally:
        ctx.close()


@pytest.mark.parametrize("allowed", [
    '[{"dst_tenant": "acme", "dst_group": "db", "proto": "tcp", "reason": "r", "sources": ["noslash"], "ports": [1]}]',
    '[{"dst_tenant": "acme", "dst_group": "db", "proto": "tcp", "reason": "r", "sources": ["a/b"], "ports": ["x"]}]',
    '[{"dst_tenant": "acme"}]',
    '[1]',
    '5',
])
def test_impact_of_a_malformed_candidate_is_a_400_with_the_reason(env: Env, allowed: str) -> None:
    """A candidate version is user input: whatever its allowed_flows looks like, impact answers 4xx, not 500."""
    mods = {"flows.rego": f"package flows\n\nallowed_flows := {allowed}\n"}
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": mods})
    assert r.status_code == 201, r.text
    imp = env.call("GET", f"/v1/policy/versions/{r.json()['number']}/impact", "security")
    assert imp.status_code == 400, imp.text
    assert "allowed_flows" in imp.json()["reason"]


def test_pdp_following_the_database_refuses_writes(tmp_path: Path) -> None:
    """A PDP that serves the active version is read-only: no local client swaps a module or adds a grant;
    and a module changed by any other means is put back on the next refresh."""
    from fastapi.testclient import TestClient

    from audit import Actor
    from pdp.server import create_pdp_app
    from pdp.sync import PdpSync
    from policy import service
    from policy.engines.embedded import RegorusEngine
    from tests.policy.dbutil import populate

    ctx = AppContext.open(make_settings(tmp_path / "home"), create=True)
    try:
        with ctx.db.session() as s:
            populate(s, ctx.clock())
            service.upload(s, shipped(), Actor("sec", "security"), now=ctx.clock())
            service.activate(s, 1, Actor("sec", "security"), now=ctx.clock())
        engine = RegorusEngine()
        sync = PdpSync(ctx.db, engine, interval=60)
        sync.run_once()
        denied = flow("acme", "web", "globex", "api", "tcp", 9443)
        assert not decide_flow(engine, denied).allow
        allow_all = 'package flows\n\ndecision := {"allow": true, "reasons": ["pwned"]}\n'
        with TestClient(create_pdp_app(engine, read_only=True)) as c:
            r = c.put("/v1/policies/flows.rego", content=allow_all, headers={"Content-Type": "text/plain"})
            assert r.status_code == 403 and r.json()["code"] == "forbidden"
            assert c.delete("/v1/policies/flows.rego").status_code == 403
            grant = {"src_group": "web", "dst_group": "api", "proto": "tcp", "ports": [9443],
                     "expires_at_ns": 9 * 10**18}
            assert c.put("/v1/data/tf/grants/acme/globex/evil", json=grant).status_code == 403
            assert c.patch("/v1/data/tf", json=[{"op": "add", "path": "/revoked/x", "value": True}]).status_code == 403
            assert c.put("/v1/data", json={}).status_code == 403
            assert c.delete("/v1/data/tf").status_code == 403
            assert c.post("/v1/data/flows/decision", json={"input": denied}).json()["result"]["allow"] is False
        assert not decide_flow(engine, denied).allow
        engine.load({**shipped(), "flows.rego": allow_all})  # changed behind the sync's back
        sync.run_once()
        assert engine.modules() == shipped() and not decide_flow(engine, denied).allow
    finally:
        ctx.close()
