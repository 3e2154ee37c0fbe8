"""Issue 13, item 5 and the policy "should fix" items, through the API served by uvicorn (real sockets):

- a pathological policy being tested or uploaded runs in the policy sandbox: `/healthz` keeps answering
  promptly, and the request ends in 422 naming the CPU budget;
- activation measures the version's decisions on the current data and refuses one over the decision
  budget, naming the budget and the figure;
- outside development mode activation needs a signature; the two-person rule keeps the uploader from
  activating alone; a version with no tests is not "passed" and cannot be activated.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlmodel import func, select

from policy.models import PolicyVersion
from policy.shipped import REGO_DIR
from policy.versions import load_dir
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.policy.conftest import free_port

SPIN_TEST = ("package spin_test\n\ntest_spin if {\n"
             "\tcount([1 | some i in numbers.range(1, 20000); some j in numbers.range(1, 20000); i == j]) > 0\n}\n")
SLOW_FLOWS = {
    "flows.rego": "package flows\n\nslow := count([i | some i in numbers.range(1, 400000); i % 3 == 0])\n\n"
                  "decision := {\"allow\": slow < 0, \"reasons\": [\"slow\"]}\n\nallowed_flows := []\n",
    "flows_test.rego": "package flows_test\n\ntest_fine if true\n",
}


def served_env(tmp_path: Path, **settings: Any) -> tuple[Env, uvicorn.Server, threading.Thread, int]:
    env = open_env(make_settings(tmp_path / "home", **settings))
    seed(env)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(env.app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    return env, server, thread, port


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Env, int]]:
    env, server, thread, port = served_env(tmp_path, policy_job_cpu_seconds=1, policy_decision_budget_ms=50)
    try:
        yield env, port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        env.client.close()
        env.ctx.close()


def call(port: int, method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.monotonic()
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={**headers, "Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data) if data else None, time.monotonic() - start


def test_healthz_answers_while_a_pathological_policy_is_tested_and_uploaded(served: tuple[Env, int]) -> None:
    """Item 5: the policy ran in the server process, holding the interpreter for seconds (minutes, for this
    one): /healthz waited all that time on the code before the fix."""
    env, port = served
    security = env.headers("security")
    before = _versions(env)
    spin = {"modules": {"s_test.rego": SPIN_TEST}}
    for path, what in (("/v1/policy/test", "policy tests"), ("/v1/policy/versions", "the policy upload")):
        answer: dict[str, Any] = {}

        def send(path: str = path, answer: dict[str, Any] = answer) -> None:
            answer["status"], answer["body"], _ = call(port, "POST", path, security, spin)

        worker = threading.Thread(target=send)
        worker.start()
        waits = []
        while worker.is_alive():
            status, _, took = call(port, "GET", "/healthz", {})
            assert status == 200
            waits.append(took)
            time.sleep(0.05)
        worker.join()
        assert answer["status"] == 422, answer
        assert answer["body"]["reason"] == f"{what} exceeded the 1 s CPU budget"
        # answered all along, not after the job (which runs to its 1 s CPU budget): at least 5 answers while it
        # ran (a server blocked on the job answers once or twice: the loop ends with the job); a loaded machine
        # once took 0.7 s, and once 1.04 s, for the first answer while the sandbox's fork server started
        assert len(waits) >= 5 and max(waits) < 1.5, waits
    assert _versions(env) == before  # nothing stored


def _versions(env: Env) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(PolicyVersion)).one())


def test_activation_refuses_a_version_over_the_decision_budget(served: tuple[Env, int]) -> None:
    """Item 5: a version whose decisions take long on the current data went in force (and every explain and
    grant decision then held the interpreter that long) on the code before the fix."""
    env, port = served
    security = env.headers("security")
    status, version, _ = call(port, "POST", "/v1/policy/versions", security, {"modules": SLOW_FLOWS})
    assert status == 201 and version["tests_passed"], version
    status, body, _ = call(port, "POST", f"/v1/policy/versions/{version['number']}/activate", security, {})
    assert status == 422, body
    reason = body["reason"]
    if reason.startswith("the activation check of"):  # ~200 ms a decision quiet; under a full suite on 2 cores the
        # check's own 1 s CPU budget can run out before the per-decision budget is compared: refused either way
        assert reason == f"the activation check of policy version {version['number']} exceeded the 1 s CPU budget"
    else:
        assert reason.startswith(f"policy version {version['number']} is not activated: on the current data its ")
        took = int(reason.split("its flow decision took ")[1].split(" ms, above the 50 ms decision budget")[0])
        assert took > 50
    active = env.call("GET", "/v1/policy/active", "security").json()
    assert active["number"] != version["number"]  # the shipped version stays in force
    status, fast, _ = call(port, "POST", "/v1/policy/versions", security, {"modules": EXTRA})
    assert status == 201
    status, body, _ = call(port, "POST", f"/v1/policy/versions/{fast['number']}/activate", security, {})
    assert status == 200 and body["state"] == "active", body  # the shipped policy decides well within 50 ms


def test_explain_never_holds_other_requests_beyond_the_budget(served: tuple[Env, int]) -> None:
    """Item 5, the hot path: a decision on the request path (here explain) holds the interpreter while it
    evaluates, so a version whose flow decision takes ~2 s would make every request wait that long while a
    tenant explains. Activation measures the version first and refuses it, so the decisions a tenant can
    trigger stay within the budget and /healthz keeps answering. Without the activation check this version
    went in force and /healthz waited for each explain."""
    env, port = served
    security = env.headers("security")
    slow = {**SLOW_FLOWS, "flows.rego": SLOW_FLOWS["flows.rego"].replace(  # ~2 s of CPU, little memory
        "[i | some i in numbers.range(1, 400000); i % 3 == 0]",
        "[1 | some i in numbers.range(1, 2000); some j in numbers.range(1, 2000); i == j]")}
    status, version, _ = call(port, "POST", "/v1/policy/versions", security, {"modules": slow})
    assert status == 201 and version["tests_passed"], version
    activated, body, _ = call(port, "POST", f"/v1/policy/versions/{version['number']}/activate", security, {})
    tenant = env.headers("tenant-admin", "acme")
    done: list[int] = []

    def explain() -> None:
        for port_number in range(5430, 5434):
            status, _, _ = call(port, "GET", f"/v1/policy/explain?src=acme/web&dst=acme/db&port={port_number}",
                                tenant)
            done.append(status)

    worker = threading.Thread(target=explain)
    worker.start()
    waits: list[float] = []
    while worker.is_alive() or len(waits) < 5:
        status, _, took = call(port, "GET", "/healthz", {})
        assert status == 200
        waits.append(took)
        time.sleep(0.02)
    worker.join()
    assert done == [200] * 4
    assert max(waits) < 1.0, waits  # the slow version's one decision alone held it ~2 s
    assert activated == 422 and f"policy version {version['number']}" in body["reason"], body


@pytest.fixture
def rules_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Env]:
    env = open_env(make_settings(tmp_path / "home", **request.param))
    seed(env)
    yield env
    env.client.close()
    env.ctx.close()


def _upload(env: Env, token: dict[str, str], modules: dict[str, str]) -> dict[str, Any]:
    r = env.client.post("/v1/policy/versions", json={"modules": modules}, headers=token)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


EXTRA = {**load_dir(REGO_DIR), "extra_test.rego": "package extra_test\n\ntest_x if true\n"}


@pytest.mark.parametrize("rules_env", [{"policy_two_person": True}], indirect=True)
def test_two_person_rule(rules_env: Env) -> None:
    """Should fix: with the two-person rule on, the uploader could activate alone on the code before the fix."""
    env = rules_env
    alice = {"Authorization": f"Bearer {env.token('security', subject='alice')}"}
    bob = {"Authorization": f"Bearer {env.token('security', subject='bob')}"}
    v = _upload(env, alice, EXTRA)
    r = env.client.post(f"/v1/policy/versions/{v['number']}/activate", json={}, headers=alice)
    assert r.status_code == 403 and r.json()["error"] == "two_person_rule"
    assert "uploaded by alice; someone else must put it in force" in r.json()["reason"]
    r = env.client.post(f"/v1/policy/versions/{v['number']}/activate", json={}, headers=bob)
    assert r.status_code == 200 and r.json()["state"] == "active"


@pytest.mark.parametrize("rules_env", [{"mode": "production"}], indirect=True)
def test_outside_development_mode_activation_needs_a_signature(rules_env: Env) -> None:
    """Should fix: with no policy key configured, any version activated unsigned on the code before the fix."""
    env = rules_env
    v = _upload(env, env.headers("security"), EXTRA)
    r = env.call("POST", f"/v1/policy/versions/{v['number']}/activate", "security", json={})
    assert r.status_code == 403 and r.json()["error"] == "signature_required"
    assert "no policy signing key is configured" in r.json()["reason"]


@pytest.mark.parametrize("rules_env", [{}], indirect=True)
def test_a_version_with_no_tests_cannot_be_activated(rules_env: Env) -> None:
    """Should fix: a version with zero tests was "passed" and activated on the code before the fix."""
    env = rules_env
    v = _upload(env, env.headers("security"), {k: t for k, t in load_dir(REGO_DIR).items() if "_test" not in k})
    assert v["tests_passed"] is False and v["tests_total"] == 0
    r = env.call("POST", f"/v1/policy/versions/{v['number']}/activate", "security", json={})
    assert r.status_code == 409 and "carries no Rego tests" in r.json()["reason"]
