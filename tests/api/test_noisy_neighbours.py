"""Issue 13, item 6: one tenant cannot slow the others down. Explain is as cheap as a grant decision (the
grant decider's kept engine and document: no document rebuilt, no engine made per call), and per-tenant
quotas (groups, workloads, active grants, pending requests) answer 409 naming the quota, writing nothing.
Explains in progress at once are limited per tenant (429 with Retry-After, naming the limit). The latency
figure (tenant B's reads while tenant A floods explain) is in bench/noisy.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import func, select

from api.limits import EvaluationSlots
from audit.models import AuditEvent
from policy import decide
from policy.engines import diff_documents, embedded
from policy.grant_decider import RegoGrantDecider
from tests.api.conftest import BOTH_DATABASES, Env, database_for, seeded_env

REQ = {"src_group": "web", "dst_tenant": "globex", "proto": "tcp", "ttl_seconds": 3600}


@pytest.fixture(params=BOTH_DATABASES)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    quotas = {"quota_groups": 3, "quota_workloads": 2, "quota_grants": 1, "quota_pending": 1}
    with seeded_env(tmp_path / "home", database_for(request), **quotas) as e:
        for role, tenant in (("admin", None), ("tenant-admin", "acme"), ("tenant-admin", "globex")):
            e.headers(role, tenant)
        yield e


def _events(env: Env) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(AuditEvent)).one())


def test_explain_reuses_the_kept_engine_and_document(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: each explain rebuilt the whole data document and a new engine on the code before the fix."""
    decider = env.app.state.grant_decider
    assert isinstance(decider, RegoGrantDecider)
    made: list[object] = []
    original = embedded.RegorusEngine.__init__

    def counting(self: embedded.RegorusEngine, *args: object, **kw: object) -> None:
        made.append(self)
        original(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(embedded.RegorusEngine, "__init__", counting)
    first = env.call("GET", "/v1/policy/explain", "tenant-admin", "acme",
                     params={"src": "acme/web", "dst": "acme/db", "port": 5432})
    assert first.status_code == 200 and first.json()["allow"] is True
    built, engines = decider.rebuilds, len(made)  # the first request made the decider's and authz's engines
    for port in range(5430, 5440):
        r = env.call("GET", "/v1/policy/explain", "tenant-admin", "acme",
                     params={"src": "acme/web", "dst": "acme/db", "port": port})
        assert r.status_code == 200 and r.json()["allow"] is (port == 5432)
    assert decider.rebuilds == built  # nothing changed: the kept document answered every time
    assert len(made) == engines  # and no explain made another
    # a change is seen by the next explain (one rebuild), never missed
    assert env.call("POST", "/v1/tenants/acme/groups/db/quarantine", "admin", json={"reason": "x"}).status_code == 200
    r = env.call("GET", "/v1/policy/explain", "tenant-admin", "acme",
                 params={"src": "acme/web", "dst": "acme/db", "port": 5432})
    assert r.json()["allow"] is False and decider.rebuilds == built + 1


def test_explain_does_not_walk_the_document_per_call(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: with the kept document, each explain still compared the engine's own copy of it with the kept
    one, key by key down to every label (equal, but never the same object): at 500 large groups that cost more
    than the decision, and tenant B's reads under tenant A's explain flood were 3x slower than under a read
    flood. The engine now knows it holds the kept document; a change is still brought in, as a difference."""
    walked: list[int] = []
    original = diff_documents  # the function policy.decide calls, by this name

    def counting(old: Mapping[str, Any], new: Mapping[str, Any], prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
        if prefix == ():
            walked.append(1)
        return original(old, new, prefix)

    def explain(port: int) -> bool:
        r = env.call("GET", "/v1/policy/explain", "tenant-admin", "acme",
                     params={"src": "acme/web", "dst": "acme/db", "port": port})
        assert r.status_code == 200
        return bool(r.json()["allow"])

    assert explain(5432) is True  # the engine takes the document (whole, the first time)
    monkeypatch.setattr(decide, "diff_documents", counting)
    assert [explain(p) for p in (5432, 5433, 5432)] == [True, False, True]
    assert walked == []
    assert env.call("POST", "/v1/tenants/acme/groups/db/quarantine", "admin", json={"reason": "x"}).status_code == 200
    assert explain(5432) is False and walked == [1]  # the change, as one difference
    assert explain(5432) is False and walked == [1]


def test_explains_in_progress_are_limited_per_tenant(env: Env) -> None:
    """Item 6: one tenant could run as many evaluations at once as it opened connections, taking as many
    worker threads and as large a share of the interpreter; now at most TRUSTFABRIC_POLICY_CONCURRENCY per
    tenant (2 by default: two members explaining at once are not refused), more answered 429 at once, naming
    the limit."""
    slots = env.app.state.evaluation_slots
    assert isinstance(slots, EvaluationSlots) and slots.limit == 2
    params = {"src": "acme/web", "dst": "acme/db", "port": 5432}
    grant = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
             "ttl_seconds": 3600}
    with slots.hold("tenant:acme", "tenant acme"):  # one of acme's explains in progress: a second is served
        r = env.call("GET", "/v1/policy/explain", "tenant-member", "acme", params=params)
        assert r.status_code == 200, r.text
        assert slots.busy("tenant:acme") == 1
        with slots.hold("tenant:acme", "tenant acme"):  # two in progress: the limit
            for path, query in (("/v1/policy/explain", params), ("/v1/policy/explain-grant", grant)):
                r = env.call("GET", path, "tenant-member", "acme", params=query)  # another acme token: same share
                assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
                assert r.json()["reason"] == ("tenant acme is at its limit of 2 policy evaluations in progress at "
                                              "once (TRUSTFABRIC_POLICY_CONCURRENCY=2); retry after 1s")
            r = env.call("GET", "/v1/policy/explain", "tenant-admin", "globex",
                         params={"src": "globex/api", "dst": "acme/web", "port": 443})
            assert r.status_code == 200  # another tenant's share is its own
            r = env.call("GET", "/v1/policy/explain", "security", params=params)
            assert r.status_code == 200  # and a platform principal's its own
    assert slots.busy("tenant:acme") == 0
    r = env.call("GET", "/v1/policy/explain", "tenant-admin", "acme", params=params)
    assert r.status_code == 200 and slots.busy("tenant:acme") == 0  # taken and given back


def test_per_tenant_quotas(env: Env) -> None:
    """Item 6: a tenant could create any number of groups and workloads on the code before the fix."""
    r = env.call("POST", "/v1/tenants/acme/groups", "tenant-admin", "acme", json={"name": "g3"})
    assert r.status_code == 201  # acme holds web, db and now g3: three, its quota
    before = _events(env)
    r = env.call("POST", "/v1/tenants/acme/groups", "tenant-admin", "acme", json={"name": "g4"})
    assert r.status_code == 409 and r.json()["error"] == "quota_exceeded"
    assert "3 workload groups" in r.json()["reason"] and "'groups' quota" in r.json()["reason"]
    r = env.call("POST", "/v1/tenants/acme/groups/web/workloads", "tenant-admin", "acme", json={"name": "w2"})
    assert r.status_code == 201  # web-1 and w2
    r = env.call("POST", "/v1/tenants/acme/groups/web/workloads", "tenant-admin", "acme", json={"name": "w3"})
    assert r.status_code == 409 and "'workloads' quota" in r.json()["reason"]
    assert _events(env) == before + 1  # only w2's registration: a refusal writes nothing
    # another tenant's quota is its own
    r = env.call("POST", "/v1/tenants/globex/groups/api/workloads", "tenant-admin", "globex", json={"name": "a2"})
    assert r.status_code == 201

    # active grants and pending requests, as the source tenant
    pending = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQ, "dst_group": "api", "ports": [443]})
    assert pending.json()["state"] == "pending"
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQ, "dst_group": "api", "ports": [8443]})
    assert r.status_code == 409 and "'pending' quota" in r.json()["reason"]
    active = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQ, "dst_group": "public", "ports": [80]})
    assert active.json()["state"] == "active"
    # approving the pending request would make a second active grant: refused, the request stays pending
    r = env.call("POST", f"/v1/grants/{pending.json()['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 409 and "'grants' quota" in r.json()["reason"]
    assert env.call("GET", f"/v1/grants/{pending.json()['id']}", "tenant-admin", "acme").json()["state"] == "pending"
    # a denied request holds nothing and is never refused by a quota
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQ, "dst_group": "nope", "ports": [1]})
    assert r.status_code == 201 and r.json()["state"] == "denied"
