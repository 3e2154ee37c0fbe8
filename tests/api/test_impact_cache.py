"""The `impact` cache (workflows/impacts.py, api/caches.py): a report is computed once per (candidate,
active version, data, fabric, budget), answered the same as a fresh computation, and computed again after
any change of the data or the fabric; switched off, every request computes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from policy.shipped import REGO_DIR
from policy.versions import load_dir
from tests.api.conftest import Client, Env
from tests.api.test_devices import approve_grant_over_the_api, fabric_env
from workflows.enforcement import impact as fresh_impact

pytestmark = pytest.mark.xdist_group("devices")


def candidate() -> dict[str, str]:
    """The shipped policy without platform services (its own tests would fail: left out)."""
    modules = {k: v for k, v in load_dir(REGO_DIR).items() if not k.endswith("_test.rego")}
    modules["flows.rego"] = modules["flows.rego"].replace('platform_tenant := "platform"',
                                                          'platform_tenant := "nowhere"', 1)
    return modules


def served(env: Env, number: int) -> dict[str, Any]:
    r = env.call("GET", f"/v1/policy/versions/{number}/impact?limit=50", "security")
    assert r.status_code == 200, r.text
    return dict(r.json())


def fresh(env: Env, number: int) -> dict[str, Any]:
    return fresh_impact(env.ctx, number, limit=50)


@pytest.mark.parametrize(("off", "database"), [(False, "sqlite"), (True, "sqlite"),
                                               pytest.param(False, "postgres", marks=pytest.mark.postgres)])
def test_an_impact_report_is_computed_once_per_state_and_equals_a_fresh_one(
        request: pytest.FixtureRequest, tmp_path: Path, off: bool, database: str) -> None:
    """On PostgreSQL too: there the key (the policy data version, step 9's counter) is read on every request,
    in the same snapshot as the data under it."""
    url = request.getfixturevalue("postgres_server").create_database() if database == "postgres" else None
    env = fabric_env(tmp_path / "home", running=False, database_url=url)
    if off:
        env.ctx.settings = replace(env.ctx.settings, cache_off=frozenset({"impact"}))
        env.client.close()
        env.app = create_app(env.ctx)
        env.client = Client(env.app, raise_server_exceptions=False)
    try:
        r = env.call("POST", "/v1/policy/versions", "security", json={"modules": candidate(), "note": "no platform"})
        assert r.status_code == 201, r.text
        number = r.json()["number"]
        reports = env.app.state.impacts
        seen = []
        for change in (None, "grant", "fabric"):
            if change == "grant":
                approve_grant_over_the_api(env)
            elif change == "fabric":  # no row under the data document changes: only the fabric does
                r = env.call("DELETE", "/v1/fabric/placements/platform/dns/ns1", "admin")
                assert r.status_code == 200, r.text
            before = reports.computations
            first, second = served(env, number), served(env, number)
            assert reports.computations == before + (2 if off else 1)
            env.call("GET", "/v1/policy/explain?src=acme/train&dst=acme/data&port=5432", "security")  # a commit
            assert served(env, number) == first, "outside the key: found again by reading the key"
            assert reports.computations == before + (3 if off else 1)
            assert first == second == fresh(env, number)
            assert first["closed_count"] > 0 and first["devices"]["devices"] > 0
            seen.append(first)
        assert seen[0]["unchanged"] != seen[1]["unchanged"], "the grant's flows count as unchanged"
        assert seen[1]["devices"]["touched"] > 0
        assert seen[2]["devices"]["touched"] == 0, "platform/dns is placed nowhere now: closing it touches no device"
    finally:
        env.client.close()
        env.ctx.close()


def test_a_runaway_candidate_is_refused_with_422_naming_the_cpu_budget_and_nothing_is_kept(tmp_path: Path) -> None:
    """Issue 13 item 5 on the served, cached report: the candidate is user-supplied Rego, evaluated in the policy
    sandbox even when the kept flow set spares evaluating the active version; a refusal is not kept."""
    from audit import Actor
    from policy import service as policy
    from policy.authoring import PreparedVersion
    from policy.testing import TestReport
    from policy.versions import version_hash

    env = fabric_env(tmp_path / "home", running=False)
    try:
        mods = candidate()
        spin = "count([1 | some i in numbers.range(1, 20000); some j in numbers.range(1, 20000); i == j]) > 0"
        mods["flows.rego"] = mods["flows.rego"].replace(
            "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)",
            f"allowed_flows := intra_tenant_flows if {{ {spin} }}")
        with env.ctx.db.session() as s:  # stored as it is (its tests are not the point): a candidate
            v, _ = policy.upload(s, PreparedVersion(mods, version_hash(mods), TestReport()), Actor("admin", "admin"),
                               now=env.clock())
        env.ctx.settings = replace(env.ctx.settings, policy_job_cpu_seconds=1)
        # the active version's set is kept and current: only the candidate is left to evaluate
        assert env.call("GET", "/v1/policy/flows/matrix", "security").status_code == 200
        reports = env.app.state.impacts
        for _ in range(2):
            r = env.call("GET", f"/v1/policy/versions/{v.number}/impact", "security")
            assert r.status_code == 422, r.text
            assert r.json()["reason"] == f"the impact report of policy version {v.number} exceeded the 1 s CPU budget"
        assert reports.computations == 0
    finally:
        env.client.close()
        env.ctx.close()
