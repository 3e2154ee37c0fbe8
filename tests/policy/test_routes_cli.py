"""The policy routes through the real app (real tokens, api_authz.rego), the CLI, and `trustfabric pdp`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.policy.helpers import REGO_DIR, shipped


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
    result = runner.invoke(cli_app, list(args), env={"TRUSTFABRIC_HOME": str(env.ctx.settings.home),
                                                         "TRUSTFABRIC_MODE": "development"})
    return result.exit_code, result.stdout, result.stderr


def test_cli_policy_commands(env: Env, tmp_path: Path) -> None:
    code, out, _ = _cli(env, "policy", "validate", str(REGO_DIR), "--json")
    assert code == 0 and len(json.loads(out)["content_hash"]) == 64
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.rego").write_text("package a\n\nx := {\n")
    code, _, err = _cli(env, "policy", "validate", str(broken))
    lines = err.strip().splitlines()  # each problem at DIR/file:line:col, then one error line
    assert code == 1 and lines[0].startswith(f"{broken}/a.rego:4:") and lines[-1].startswith("error: 1 problem")
    assert "Traceback" not in err
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
    assert code == 1 and out.startswith("DENY") and "no-grant:" in out
    code, out, _ = _cli(env, "policy", "explain", "--src", "acme/web", "--dst", "acme/db", "--port", "5432",
                        "--json")
    assert code == 0 and json.loads(out)["allow"] is True
    code, _, err = _cli(env, "policy", "rollback", "1")
    assert code == 1 and err.count("\n") == 1 and "earlier" in err
    code, _, err = _cli(env, "policy", "show", "nope")  # no version number nor hash prefix: usage, while parsing
    assert code == 2 and "'nope' is neither a policy version number" in " ".join(err.split())
    code, _, err = _cli(env, "policy", "show", "99")  # a version that could be, and is not: a failure
    assert code == 1 and err.startswith("error:") and "does not exist" in err
    code, _, _ = _cli(env, "policy", "explain", "--src", "acme/web")
    assert code == 2


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



def test_rollback_to_a_newer_version_says_so_before_its_tests(env: Env) -> None:
    """`policy rollback 2` with 1 active and 2 newer (its tests failing) is refused as no rollback, not for its
    tests: the operator asked the wrong direction, and fixing the tests would not make it one."""
    mods = shipped()
    assert env.call("POST", "/v1/policy/versions", "security", json={"modules": mods}).status_code == 201
    assert env.call("POST", "/v1/policy/versions/1/activate", "security", json={}).status_code == 200
    failing = {**mods, "zz_test.rego": "package zz_test\n\ntest_no if false\n"}
    newer = env.call("POST", "/v1/policy/versions", "security", json={"modules": failing})
    assert newer.json()["number"] == 2 and not newer.json()["tests_passed"], newer.text
    answer = env.call("POST", "/v1/policy/versions/2/rollback", "security", json={})
    assert answer.status_code == 409
    assert answer.json()["reason"].endswith("version 2 is not older than the active version 1"), answer.text
    code, _, err = _cli(env, "policy", "rollback", "2")
    assert code == 1 and "version 2 is not older than the active version 1" in err and "tests" not in err, err
