"""`Prefer: respond-async` on the slow reads (api/computing.py): the impact report and the flow set
are answered 202 while they are computed in the background, never with an answer from before a change;
once computed, the answer is the one a fresh computation gives and reflects the change (real database,
real Rego, the policy sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from api.computing import prefers_async
from policy.flowset import FlowSets
from policy.matrix import pair_counts
from tests.api.conftest import BOTH_DATABASES, Env, database_for
from tests.api.test_devices import approve_grant_over_the_api, fabric_env
from tests.api.test_impact_cache import candidate
from workflows.enforcement import impact as fresh_impact

pytestmark = pytest.mark.xdist_group("devices")
ASYNC = {"Prefer": "respond-async"}
JOBS_SECONDS = 120.0  # a bound on the background computations of one step (a loaded 2-core machine)


@pytest.mark.parametrize(("value", "expected"), [
    ("respond-async", True), ("RESPOND-ASYNC", True), ("wait=5, respond-async", True),
    ("respond-async; foo=bar", True), ("handling=lenient", False), ("", False), ("respond-asyncx", False)])
def test_prefer_respond_async_is_read_as_rfc_7240_says(value: str, expected: bool) -> None:
    scope = {"type": "http", "headers": [(b"prefer", value.encode())] if value else []}
    assert prefers_async(Request(scope)) is expected


@pytest.fixture(params=BOTH_DATABASES)
def fenv(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    env = fabric_env(tmp_path / "home", running=False, database_url=database_for(request))
    try:
        yield env
    finally:
        env.app.state.impacts.stop_background()
        env.app.state.flow_sets.stop_background()
        assert env.app.state.impacts.wait_started(JOBS_SECONDS)
        assert env.app.state.flow_sets.wait_started(JOBS_SECONDS)
        env.client.close()
        env.ctx.close()


def ready(env: Env, url: str, jobs: Any) -> dict[str, Any]:
    """The async answer after the background work it started: 202 first (nothing current is kept), then 200."""
    r = env.call("GET", url, "security", headers=ASYNC)
    assert r.status_code == 202, r.text
    assert r.json() == {"state": "computing", "retry_after_seconds": 1}
    assert r.headers["retry-after"] == "1" and r.headers["preference-applied"] == "respond-async"
    assert jobs.wait_started(JOBS_SECONDS), "the background computation did not finish in time"
    r = env.call("GET", url, "security", headers=ASYNC)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_impact_report_is_computed_in_the_background_and_follows_a_grant_change(fenv: Env) -> None:
    env = fenv
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": candidate(), "note": "no platform"})
    assert r.status_code == 201, r.text
    url = f"/v1/policy/versions/{r.json()['number']}/impact?limit=50"
    reports = env.app.state.impacts
    first = ready(env, url, reports)
    assert first == fresh_impact(env.ctx, r.json()["number"], limit=50)
    assert env.call("GET", url, "security", headers=ASYNC).json() == first, "kept: answered at once"
    computed = reports.computations
    approve_grant_over_the_api(env)  # acme/train -> globex/api:8443, which the candidate leaves open
    after = ready(env, url, reports)  # 202 first: the report from before the grant is never answered
    assert reports.computations == computed + 1
    assert after == fresh_impact(env.ctx, r.json()["number"], limit=50)
    assert after["unchanged"] == first["unchanged"] + 1, "the granted flow is open under both versions"
    assert env.call("GET", url, "security").json() == after, "without the preference: the same report, waited for"


def test_flow_matrix_and_cell_are_computed_in_the_background_and_follow_a_grant_change(fenv: Env) -> None:
    env = fenv
    sets = env.app.state.flow_sets
    sets.stop_background()
    env.app.state.flow_sets = sets = FlowSets(env.ctx.db)  # nothing kept yet (the fixture's app computed one)
    matrix = "/v1/policy/flows/matrix?limit=100"
    cell = "/v1/policy/flows?src_tenant=acme&dst_tenant=globex"
    before = {(c["src_tenant"], c["dst_tenant"]): c["flows"] for c in ready(env, matrix, sets)["cells"]}
    assert env.call("GET", cell, "security", headers=ASYNC).json()["total"] == before.get(("acme", "globex"), 0)
    gid = approve_grant_over_the_api(env)
    after = {(c["src_tenant"], c["dst_tenant"]): c["flows"] for c in ready(env, matrix, sets)["cells"]}
    assert after[("acme", "globex")] == before.get(("acme", "globex"), 0) + 1
    fresh = FlowSets(env.ctx.db, keep=False).current(env.clock())
    assert after == {pair: n for pair, n in pair_counts(fresh.raw).items()}
    listing = env.call("GET", cell, "security", headers=ASYNC).json()
    assert any(f"grant:{gid}" in f["reasons"] for f in listing["items"])
    r = env.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", "acme", json={"reason": "done"})
    assert r.status_code == 200, r.text
    r = env.call("GET", cell, "security", headers=ASYNC)
    assert r.status_code == 202, "the cell's list from before the revocation is never answered"
    assert sets.wait_started(JOBS_SECONDS)
    listing = env.call("GET", cell, "security", headers=ASYNC).json()
    assert not any(f"grant:{gid}" in f["reasons"] for f in listing["items"])


def test_a_failed_background_computation_is_answered_once_then_tried_again(fenv: Env) -> None:
    env = fenv
    modules = {"flows.rego": "package flows\n\nallowed_flows := 5\n"}
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": modules, "note": "not a list"})
    assert r.status_code == 201, r.text
    url = f"/v1/policy/versions/{r.json()['number']}/impact"
    reports = env.app.state.impacts
    assert env.call("GET", url, "security", headers=ASYNC).status_code == 202
    assert reports.wait_started(JOBS_SECONDS)
    refused = env.call("GET", url, "security", headers=ASYNC)
    assert refused.status_code == 400 and "allowed_flows" in refused.json()["reason"], refused.text
    assert env.call("GET", url, "security", headers=ASYNC).status_code == 202, "asked again: computed again"
    assert reports.wait_started(JOBS_SECONDS)
    assert env.call("GET", url, "security").status_code == 400, "the same refusal, waited for"
