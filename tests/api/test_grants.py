"""Grant lifecycle end to end over HTTP: decisions from grants.rego, approval rules, expiry to the second
with an injectable clock, idempotent retries, concurrent approvals (exactly one wins)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import func, select

from api.background import sweep_grants
from audit.models import AuditEvent
from policy import grants as svc
from policy.data import build_data
from policy.models import Grant
from tests.api.conftest import Env, make_settings, open_env, seed

REQ = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
       "ttl_seconds": 3600, "justification": "call the globex API"}


def request(env: Env, body: dict[str, Any] | None = None, *, role: str = "tenant-admin", tenant: str = "acme",
            key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return env.call("POST", "/v1/grants", role, tenant, json=body or REQ, headers=headers)


def events(env: Env, action: str | None = None) -> int:
    with env.ctx.db.read_session() as s:
        q = select(func.count()).select_from(AuditEvent)
        if action:
            q = q.where(AuditEvent.action == action)
        return int(s.exec(q).one())


def live_in_policy_data(env: Env, grant_id: str) -> bool:
    with env.ctx.db.read_session() as s:
        data = build_data(s, env.clock())
    return grant_id in data["tf"]["grants"].get("acme", {}).get("globex", {})


def test_pending_then_approved_by_destination_then_expires_to_the_second(env_both: Env) -> None:
    env = env_both
    r = request(env)
    assert r.status_code == 201, r.text
    g = r.json()
    assert g["state"] == "pending"
    assert g["pending_approvers"] == ["tenant-admin:globex"]
    assert g["reasons"] == ["approval-needed: tenant-admin:globex"]
    assert events(env, "grant.request") == 1

    # the requesting tenant cannot approve its own request; a member cannot approve at all
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "acme")
    assert r.status_code == 403 and "own grant request" in r.json()["reason"]
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-member", "globex")
    assert r.status_code == 403 and "not-permitted" in r.json()["reason"]
    # security is not a named approver of a normal group
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "security")
    assert r.status_code == 403 and "not a named approver" in r.json()["reason"]
    assert env.call("GET", f"/v1/grants/{g['id']}", "tenant-member", "acme").json()["state"] == "pending"

    env.clock.advance(timedelta(seconds=10))
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex", json={"comment": "ok"})
    assert r.status_code == 200, r.text
    active = r.json()
    assert active["state"] == "active" and active["pending_approvers"] == []
    assert active["approvals"][0]["as"] == "tenant-admin:globex"
    assert live_in_policy_data(env, g["id"])
    # approving twice is a conflict, and says why
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 409 and "only a pending grant" in r.json()["reason"]

    env.clock.advance(timedelta(seconds=3599))
    assert env.call("GET", f"/v1/grants/{g['id']}", "tenant-admin", "acme").json()["state"] == "active"
    env.clock.advance(timedelta(seconds=1))  # exactly ttl after activation
    got = env.call("GET", f"/v1/grants/{g['id']}", "tenant-admin", "acme").json()
    assert got["state"] == "expired" and "expired: ttl elapsed" in got["reasons"]
    assert not live_in_policy_data(env, g["id"])
    listed = env.call("GET", "/v1/grants?state=active", "tenant-admin", "acme").json()["items"]
    assert listed == []
    listed = env.call("GET", "/v1/grants?state=expired", "tenant-admin", "globex").json()["items"]
    assert [x["id"] for x in listed] == [g["id"]]

    # the sweeper persists it, once, with its audit event
    assert sweep_grants(env.ctx) == [g["id"]]
    assert sweep_grants(env.ctx) == []
    assert events(env, "grant.expire") == 1
    with env.ctx.db.read_session() as s:
        row = s.get(Grant, g["id"])
        assert row is not None and row.state == "expired"
    r = env.call("POST", f"/v1/grants/{g['id']}/revoke", "tenant-admin", "acme", json={"reason": "done"})
    assert r.status_code == 409


def test_sensitive_destination_needs_security_too(env: Env) -> None:
    g = request(env, {**REQ, "dst_group": "vault", "ports": [8200]}).json()
    assert g["state"] == "pending"
    assert g["required_approvers"] == ["security", "tenant-admin:globex"]
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 200 and r.json()["state"] == "pending"
    assert r.json()["pending_approvers"] == ["security"]
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "security")
    assert r.status_code == 200 and r.json()["state"] == "active"


def test_auto_approved_and_denied_requests(env: Env) -> None:
    g = request(env, {**REQ, "dst_group": "public", "ports": [80]}).json()
    assert g["state"] == "active" and g["expires_at"] is not None
    assert g["reasons"][0].startswith("auto-approve")

    # acme holds a grant request with globex/api (pending), so the policy's reasons about globex/api are
    # its to see; about a group it holds no grant with, nothing is disclosed (policy/disclosure.py)
    assert request(env).json()["state"] == "pending"
    cases = [
        ({**REQ, "ports": [22]}, "port-not-exposed"),
        ({**REQ, "ports": [0]}, "wildcard-ports"),
        ({**REQ, "ports": []}, "wildcard-ports"),
        ({**REQ, "dst_group": "nope"}, "undisclosed: "),
        ({**REQ, "dst_tenant": "acme", "dst_group": "db"}, "same-tenant"),
    ]
    for body, reason in cases:
        r = request(env, body)
        assert r.status_code == 201, r.text
        assert r.json()["state"] == "denied", (body, r.json())
        assert any(x.startswith(reason) for x in r.json()["reasons"]), (reason, r.json()["reasons"])
    # above the maximum grant TTL: refused by the code (400, nothing written) before any policy is asked
    r = request(env, {**REQ, "ttl_seconds": 8 * 86400})
    assert r.status_code == 400 and "maximum grant TTL of 604800 s" in r.json()["reason"]
    # in the units `--ttl` takes, beside the seconds
    assert r.json()["reason"] == "ttl_seconds 691200 (8d) is above the maximum grant TTL of 604800 s (7d)"
    # quarantine of the destination denies new requests
    r = env.call("POST", "/v1/tenants/globex/quarantine", "security", json={"reason": "incident"})
    assert r.status_code == 200 and r.json()["quarantined"] is True
    d = request(env).json()
    assert d["state"] == "denied" and any(x.startswith("quarantined") for x in d["reasons"])


def test_scope_comes_from_the_principal(env: Env) -> None:
    r = request(env, {**REQ, "src_tenant": "globex"})
    assert r.status_code == 403 and "own groups" in r.json()["reason"]
    r = request(env, {**REQ, "src_tenant": "acme"})
    assert r.status_code == 201
    r = request(env, {**REQ, "src_group": "api"})  # a group of another tenant as source: not in acme
    assert r.json()["state"] == "denied"
    r = request(env, {**REQ, "surprise": 1})
    assert r.status_code == 422 and "extra" in r.json()["reason"].lower()
    r = env.call("POST", "/v1/grants", "security", json={**REQ, "src_tenant": "acme"})
    assert r.status_code == 403  # security approves, it does not request
    r = env.call("POST", "/v1/grants", "admin", json=REQ)
    assert r.status_code == 400 and "src_tenant" in r.json()["reason"]


def test_reject_revoke_and_visibility(env: Env) -> None:
    g1 = request(env).json()
    r = env.call("POST", f"/v1/grants/{g1['id']}/reject", "tenant-admin", "globex", json={"reason": "no"})
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    assert "rejected: no" in r.json()["reasons"]
    g2 = request(env, {**REQ, "dst_group": "public", "ports": [80]}).json()
    # a third tenant sees neither, and cannot act on them
    with env.ctx.db.session() as s:
        from audit import Actor
        from inventory.service import create_tenant

        create_tenant(s, slug="initech", display_name="Initech", actor=Actor.system("t"))
    for gid in (g1["id"], g2["id"]):
        assert env.call("GET", f"/v1/grants/{gid}", "tenant-admin", "initech").status_code == 404
        r = env.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", "initech", json={"reason": "x"})
        assert r.status_code == 404
    assert env.call("GET", "/v1/grants", "tenant-admin", "initech").json()["items"] == []
    # the destination sees both; the auditor sees everything; nobody else's grants leak
    assert len(env.call("GET", "/v1/grants", "tenant-member", "globex").json()["items"]) == 2
    assert len(env.call("GET", "/v1/grants", "auditor").json()["items"]) == 2
    r = env.call("POST", f"/v1/grants/{g2['id']}/revoke", "tenant-admin", "acme", json={"reason": "done"})
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    assert not live_in_policy_data(env, g2["id"])
    r = env.call("POST", f"/v1/grants/{g2['id']}/revoke", "auditor", json={"reason": "x"})
    assert r.status_code == 403


def test_pending_times_out(env: Env) -> None:
    g = request(env).json()
    env.clock.advance(env.ctx.settings.grant_pending_ttl)
    got = env.call("GET", f"/v1/grants/{g['id']}", "tenant-admin", "acme").json()
    assert got["state"] == "expired" and "expired: approval timed out" in got["reasons"]
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 409 and "expired" in r.json()["reason"]


def test_idempotent_retries(env_both: Env) -> None:
    env = env_both
    first = request(env, key="req-42")
    assert first.status_code == 201
    n = events(env)
    again = request(env, key="req-42")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert events(env) == n  # a replay writes nothing
    r = request(env, {**REQ, "ports": [8443]}, key="req-42")
    assert r.status_code == 409 and "Idempotency-Key" in r.json()["reason"]
    # the key is per requester: another principal's identical key is a new request
    other = env.token("tenant-admin", "acme", subject="other-admin")
    r = env.client.post("/v1/grants", json=REQ,
                        headers={"Authorization": f"Bearer {other}", "Idempotency-Key": "req-42"})
    assert r.status_code == 201 and r.json()["id"] != first.json()["id"]
    r = request(env, key="bad key with spaces")
    assert r.status_code == 422


def test_an_idempotency_key_is_scoped_by_the_requesters_tenant_not_only_its_subject(env_both: Env) -> None:
    """API token subjects are free text (`token create --subject`): acme's and globex's token for `alice` are both
    principal `alice`. Each tenant's alice has Idempotency-Keys of her own: the same key is a request of its own for
    each (never a 409 that tells one tenant another used the key), a retry answers each with her own grant, and
    the platform's alice (no tenant) is a third requester, never answered with a tenant's grant."""
    env = env_both

    def as_alice(role: str, tenant: str | None, body: dict[str, Any]) -> Any:
        token = env.token(role, tenant, subject="alice")
        return lambda: env.client.post("/v1/grants", json=body,
                                       headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k-1"})

    acme = as_alice("tenant-admin", "acme", REQ)
    globex = as_alice("tenant-admin", "globex", {**REQ, "src_group": "api", "dst_tenant": "acme", "dst_group": "web"})
    platform = as_alice("admin", None, {**REQ, "src_tenant": "acme"})  # the very request acme's alice made

    first = acme()
    assert first.status_code == 201, first.text
    theirs = globex()
    assert theirs.status_code == 201, theirs.text  # not 409 "already used for a different grant request"
    ours = platform()
    assert ours.status_code == 201, ours.text  # not acme's grant handed back
    ids = {first.json()["id"], theirs.json()["id"], ours.json()["id"]}
    assert len(ids) == 3
    assert (theirs.json()["src_tenant"], ours.json()["src_tenant"]) == ("globex", "acme")
    # and each says whose it is: the id alone is all three's
    assert [g.json()["requester_tenant"] for g in (first, theirs, ours)] == ["acme", "globex", None]
    listed = env.call("GET", "/v1/grants", "admin").json()["items"]
    assert {(g["requested_by"], g["requester_tenant"]) for g in listed} == {
        ("alice", "acme"), ("alice", "globex"), ("alice", None)}
    for call, original in ((acme, first), (globex, theirs), (platform, ours)):
        again = call()
        assert again.status_code == 200 and again.json() == original.json()  # its own grant, and only it
    assert events(env, "grant.request") == 3


def test_concurrent_retries_with_one_key_create_one_grant(env_both: Env) -> None:
    env = env_both
    env.headers("tenant-admin", "acme")
    results: list[int] = []
    ids: set[str] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker() -> None:
        with TestClient(env.app, raise_server_exceptions=False) as client:
            barrier.wait()
            r = client.post("/v1/grants", json=REQ, headers={**env.headers("tenant-admin", "acme"),
                                                              "Idempotency-Key": "same"})
            with lock:
                results.append(r.status_code)
                ids.add(r.json().get("id", ""))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] * 5 + [201], results
    assert len(ids) == 1
    assert events(env, "grant.request") == 1


def test_concurrent_approvals_exactly_one_wins(env_both: Env) -> None:
    env = env_both
    gid = request(env).json()["id"]
    headers = env.headers("tenant-admin", "globex")
    results: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        with TestClient(env.app, raise_server_exceptions=False) as client:
            barrier.wait()
            r = client.post(f"/v1/grants/{gid}/approve", headers=headers)
            with lock:
                results.append(r.status_code)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] + [409] * 7, results
    assert events(env, "grant.approve") == 1
    with env.ctx.db.read_session() as s:
        row = s.get(Grant, gid)
        assert row is not None and row.version == 2 and len(row.approvals) == 1


def test_compare_and_set_refuses_a_stale_version(env_both: Env) -> None:
    """The CAS itself, deterministically: a change based on a version someone else moved past fails."""
    env = env_both
    gid = request(env).json()["id"]
    with env.ctx.db.read_session() as s:
        stale = s.get(Grant, gid)
        assert stale is not None
    assert env.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex").status_code == 200
    with pytest.raises(svc.GrantConflict), env.ctx.db.session() as s:
        merged = s.merge(stale, load=False)
        svc._cas(s, merged, state="revoked")
    with env.ctx.db.read_session() as s:
        row = s.get(Grant, gid)
        assert row is not None and row.state == "active"


def test_paging_and_filters(env: Env) -> None:
    ids = [request(env, key=f"k{i}").json()["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        url = "/v1/grants?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = env.call("GET", url, "tenant-admin", "acme").json()
        seen += [g["id"] for g in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids)  # id order (time-ordered; ties within a millisecond by random suffix)
    assert env.call("GET", "/v1/grants?limit=201", "admin").status_code == 422
    assert env.call("GET", "/v1/grants?cursor=%%%", "admin").status_code == 400
    assert env.call("GET", "/v1/grants?state=bogus", "admin").status_code == 422
    assert len(env.call("GET", "/v1/grants?dst_tenant=globex&state=pending", "admin").json()["items"]) == 5


def test_background_sweeper_runs_in_the_server_process(tmp_path: Path) -> None:
    env = open_env(make_settings(tmp_path / "home", sweep_interval_seconds=0.05), background=True)
    try:
        seed(env)
        with TestClient(env.app) as client:  # the lifespan starts and stops the sweeper thread
            g = client.post("/v1/grants", json={**REQ, "dst_group": "public", "ports": [80]},
                            headers=env.headers("tenant-admin", "acme")).json()
            assert g["state"] == "active"
            env.clock.advance(timedelta(seconds=REQ["ttl_seconds"]))  # type: ignore[arg-type]
            deadline = time.monotonic() + 10
            while events(env, "grant.expire") == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert events(env, "grant.expire") == 1
        with env.ctx.db.read_session() as s:
            row = s.get(Grant, g["id"])
            assert row is not None and row.state == "expired"
        jobs = env.app.state.background
        assert jobs is not None and jobs._thread is not None and not jobs.is_alive()
    finally:
        env.client.close()
        env.ctx.close()


def test_cached_reads_see_every_commit_from_any_connection(env_both: Env) -> None:
    """The hot reads (token rows, grant pages) are cached only while the database is unchanged: a write
    by another connection (another worker process, a CLI) is visible on the very next request; on PostgreSQL
    a grant page within the change feed's bound (api/readcache.py; a token row is never cached there)."""
    from audit import Actor
    from pki.tokens.service import revoke_token
    from store.db import Database

    env = env_both
    g = request(env).json()
    for _ in range(2):  # fill, then hit the cache
        items = env.call("GET", "/v1/grants", "tenant-member", "globex").json()["items"]
        assert [x["state"] for x in items] == ["pending"]
    other = Database(env.ctx.db.url)  # a second engine, like a second worker or the CLI
    try:
        with other.session() as s:
            svc.revoke_grant(s, g["id"], caller=svc.Caller("sec", "security", None, Actor("sec", "security")),
                             reason="elsewhere", clock=env.clock)
        deadline = time.monotonic() + (0.0 if env.ctx.db.dialect == "sqlite" else 0.1)  # the README's bound
        while True:
            items = env.call("GET", "/v1/grants", "tenant-member", "globex").json()["items"]
            if [x["state"] for x in items] == ["revoked"] or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        assert [x["state"] for x in items] == ["revoked"]
        token = env.token("auditor")
        jti = __import__("jwt").decode(token, options={"verify_signature": False})["jti"]
        auth = {"Authorization": f"Bearer {token}"}
        assert env.client.get("/v1/grants", headers=auth).status_code == 200
        assert env.client.get("/v1/grants", headers=auth).status_code == 200
        with other.session() as s:
            revoke_token(s, jti, actor=Actor.system("t"), reason="elsewhere", clock=env.clock)
        assert env.client.get("/v1/grants", headers=auth).status_code == 401
    finally:
        other.dispose()


def test_grant_decisions_come_from_the_active_policy_version(env: Env) -> None:
    """Activating a version with a stricter grants.rego changes the next decision; rolling back restores
    the earlier one; with no version in force every request is denied, saying why (fail closed)."""
    from policy.shipped import REGO_DIR
    from policy.versions import load_dir

    two_hours = {**REQ, "ttl_seconds": 7200}
    assert request(env, two_hours).json()["state"] == "pending"  # shipped policy: 7 days maximum
    strict = load_dir(REGO_DIR)
    strict["grants.rego"] = strict["grants.rego"].replace("max_ttl_seconds := 604800", "max_ttl_seconds := 3600")
    strict["grants_test.rego"] = strict["grants_test.rego"].replace("604800", "3600")
    v = env.call("POST", "/v1/policy/versions", "security", json={"modules": strict})
    assert v.status_code == 201, v.text
    r = env.call("POST", f"/v1/policy/versions/{v.json()['number']}/activate", "security", json={})
    assert r.status_code == 200, r.text
    d = request(env, two_hours).json()
    assert d["state"] == "denied" and any(x.startswith("ttl-too-long: 7200 s") for x in d["reasons"]), d
    assert request(env).json()["state"] == "pending"  # one hour is still fine
    r = env.call("POST", "/v1/policy/versions/1/rollback", "security", json={"reason": "too strict"})
    assert r.status_code == 200, r.text
    assert request(env, two_hours).json()["state"] == "pending"
    with env.ctx.db.session() as s:  # nothing in force (as after a failed bootstrap)
        from sqlalchemy import text

        s.connection().execute(text("UPDATE policy_versions SET state = 'retired'"))
    d = request(env).json()
    assert d["state"] == "denied" and d["reasons"][0].startswith("no-policy:"), d


def test_every_grant_decision_is_in_the_decision_log(env_both: Env) -> None:
    """Input, outcome, reasons and the deciding policy version's hash; a replay adds nothing. On both databases:
    on PostgreSQL the record is written in the grant's own INSERT statement (policy.grants._insert)."""
    env = env_both
    active = env.call("GET", "/v1/policy/active", "auditor").json()["content_hash"]
    pending = request(env, key="log-1").json()
    assert request(env, key="log-1").status_code == 200  # idempotent replay: no second decision
    denied = request(env, {**REQ, "ports": [22]}).json()
    logged = env.call("GET", "/v1/policy/decisions", "auditor", params={"kind": "grant"}).json()
    assert [(d["outcome"], d["allowed"]) for d in logged] == [("deny", False), ("pending", True)]
    assert [d["reasons"] for d in logged] == [denied["reasons"], pending["reasons"]]
    assert all(d["policy_hash"] == active and d["tenant"] == "acme" for d in logged)
    assert logged[1]["input"]["dst"] == {"tenant": "globex", "group": "api"} and logged[1]["input"]["ports"] == [443]
    assert logged[1]["result"]["approvers"] == ["tenant-admin:globex"]


def test_the_activating_approval_asks_the_policy_in_force_again(env: Env) -> None:
    """What changed since the request is not waved through: a quarantine refuses the approval (nothing
    written, the reasons given); a destination that became sensitive now needs security too."""
    from inventory.models import WorkloadGroup

    g = request(env).json()
    r = env.call("POST", "/v1/tenants/acme/quarantine", "security", json={"reason": "incident"})
    assert r.status_code == 200
    env.headers("tenant-admin", "globex")  # its token minted (and audited) before counting
    n = events(env)
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 409, r.text
    assert "policy in force now denies" in r.json()["reason"] and "quarantined" in r.json()["reason"]
    assert events(env) == n
    got = env.call("GET", f"/v1/grants/{g['id']}", "tenant-admin", "globex").json()
    assert got["state"] == "pending" and got["approvals"] == [] and got["version"] == 1
    r = env.call("POST", "/v1/tenants/acme/unquarantine", "security", json={"reason": "resolved"})
    assert r.status_code == 200
    with env.ctx.db.session() as s:  # the destination group is reclassified while the request waits
        grp = s.exec(select(WorkloadGroup).where(WorkloadGroup.tenant == "globex",
                                                 WorkloadGroup.name == "api")).one()
        grp.sensitivity = "sensitive"
        s.add(grp)
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "tenant-admin", "globex")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "pending" and r.json()["pending_approvers"] == ["security"]
    assert r.json()["required_approvers"] == ["security", "tenant-admin:globex"]
    r = env.call("POST", f"/v1/grants/{g['id']}/approve", "security")
    assert r.status_code == 200 and r.json()["state"] == "active", r.text
    assert live_in_policy_data(env, g["id"])


def test_identities_revoked_through_pki_withdraw_flows_and_grants(env: Env) -> None:
    """POST /v1/svids/revoke by workload or by group is an identity revocation: the policy data carries it,
    so explain, the allowed flow set and new grant requests all deny (revoked identities override all)."""
    from policy.decide import Flow, allowed_flow_set
    from policy.service import engine_for_active

    web1 = "spiffe://example.org/tenant/acme/group/web/web-1"
    ok = env.call("GET", "/v1/policy/explain", "security", params={"src": web1, "dst": "acme/db", "port": 5432})
    assert ok.json()["allow"] is True, ok.text
    r = env.call("POST", "/v1/svids/revoke", "security",
                 json={"tenant": "acme", "group": "web", "workload": "web-1", "reason": "key leaked"})
    assert r.status_code == 200, r.text
    d = env.call("GET", "/v1/policy/explain", "security", params={"src": web1, "dst": "acme/db", "port": 5432})
    assert d.json()["allow"] is False and d.json()["reasons"][0].startswith("revoked-identity:"), d.text
    assert env.call("GET", "/v1/policy/explain", "security",
                    params={"src": "acme/web", "dst": "acme/db", "port": 5432}).json()["allow"] is True

    r = env.call("POST", "/v1/svids/revoke", "security", json={"tenant": "acme", "group": "web", "reason": "breach"})
    assert r.status_code == 200, r.text
    d = env.call("GET", "/v1/policy/explain", "security", params={"src": "acme/web", "dst": "acme/db", "port": 5432})
    assert d.json()["allow"] is False
    assert d.json()["reasons"] == ["revoked-identity: every identity of acme/web is revoked"]
    with env.ctx.db.read_session() as s:
        engine, _ = engine_for_active(s, env.clock())
    flows = allowed_flow_set(engine)
    engine.close()
    assert Flow("acme", "db", "acme", "web", "tcp", 443) not in flows
    assert not any(f.src_tenant == "acme" and f.src_group == "web" for f in flows)
    g = request(env).json()
    assert g["state"] == "denied" and any(x.startswith("revoked-identity:") for x in g["reasons"]), g


def test_a_grant_request_checks_its_token_off_the_event_loop_and_refuses_as_before(env: Env) -> None:
    """POST /v1/grants authenticates in the worker thread its work runs in (one hand-off): the token's row is
    read from the database, which must not hold the event loop. The refusals are those of every route: a bad
    or revoked token 401 with its reason, nothing written; and the principal is the one the access log names."""
    import asyncio

    import jwt

    from audit import Actor
    from pki.tokens.service import revoke_token

    seen: list[bool] = []  # per authenticator call: was it made on a thread running an event loop?

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    authenticators = env.app.state.authenticators

    def recording(ctx: Any, req: Any, inner: Any) -> Any:
        seen.append(on_loop())
        return inner(ctx, req)

    env.app.state.authenticators = [lambda c, r, a=a: recording(c, r, a) for a in authenticators]
    assert request(env).status_code == 201
    assert seen and not any(seen), seen
    seen.clear()
    assert env.call("GET", "/v1/grants", "tenant-admin", "acme").status_code == 200
    assert seen and all(seen)  # a route running on the loop still checks there (no hand-off of its own)

    r = env.client.post("/v1/grants", json=REQ, headers={"Authorization": "Bearer not-a-token"})
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated", r.text
    assert r.headers["www-authenticate"] == "Bearer"
    token = env.token("tenant-admin", "acme")
    with env.ctx.db.session() as s:
        revoke_token(s, jwt.decode(token, options={"verify_signature": False})["jti"], actor=Actor.system("t"),
                     reason="test", clock=env.clock)
    before = events(env)
    r = env.client.post("/v1/grants", json=REQ, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and r.json()["reason"] == "token revoked", r.text
    assert events(env) == before  # nothing written


def test_an_invalid_grant_request_is_refused_for_its_credentials_first(env: Env) -> None:
    """POST /v1/grants checks its token in its worker thread, after FastAPI validated the body and the
    Idempotency-Key on the loop; a request invalid in them is still authenticated first, as every route whose
    principal is a dependency: 401 without (or with a bad) token, 422 with the reason with a good one."""
    bad_body = {**REQ, "ports": "all"}
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        r = env.client.post("/v1/grants", json=bad_body, headers=headers)
        assert r.status_code == 401 and r.json()["error"] == "unauthenticated", r.text
        r = env.client.post("/v1/grants", json=REQ, headers={**headers, "Idempotency-Key": "no spaces allowed"})
        assert r.status_code == 401, r.text
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=bad_body)
    assert r.status_code == 422 and r.json()["reason"].startswith("body.ports"), r.text
    r = request(env, key="no spaces allowed")
    assert r.status_code == 422 and "Idempotency-Key" in r.json()["reason"], r.text
    assert events(env, "grant.request") == 0


def test_a_port_or_ttl_that_is_not_a_json_integer_is_refused(env: Env) -> None:
    """`true` was taken as port 1 (and ttl 1 s), `"8443"` as 8443: pydantic's lax mode coerced them and the grant
    (and its audit event) was written for a port nobody named."""
    env.headers("tenant-admin", "acme"), env.headers("admin")  # their tokens minted (audited) beforehand
    before = events(env)
    for body in ({**REQ, "ports": [True]}, {**REQ, "ports": ["443"]}, {**REQ, "ports": [443.0]},
                 {**REQ, "ttl_seconds": True}, {**REQ, "ttl_seconds": "3600"}):
        r = request(env, body)
        assert r.status_code == 422, (body, r.text)
    r = env.call("POST", "/v1/tenants/acme/groups", "admin",
                 json={"name": "g", "ports": [{"proto": "tcp", "port": True}]})
    assert r.status_code == 422, r.text
    assert events(env) == before


def test_sweep_expires_each_grant_in_one_update_with_its_event_and_no_savepoint(env_both: Env) -> None:
    """The sweeper runs after every active grant under a stream of them: per grant one UPDATE and its audit event,
    no SAVEPOINT around them and no read of the row again (they were most of its CPU); every due grant expired
    once, its reasons kept with the expiry's appended, its version moved on, its event under its own tenant."""
    from sqlalchemy import event

    env = env_both
    pending = request(env).json()
    active = request(env).json()
    assert env.call("POST", f"/v1/grants/{active['id']}/approve", "tenant-admin", "globex").json()["state"] == "active"
    with env.ctx.db.read_session() as s:
        before = {gid: s.get(Grant, gid) for gid in (pending["id"], active["id"])}
    env.clock.advance(timedelta(days=4))  # past the active grant's TTL and the pending one's approval window
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement.split(None, 1)[0].upper())

    event.listen(env.ctx.db.engine, "before_cursor_execute", count)
    try:
        assert sorted(sweep_grants(env.ctx)) == sorted([pending["id"], active["id"]])
    finally:
        event.remove(env.ctx.db.engine, "before_cursor_execute", count)
    assert "SAVEPOINT" not in sent and "RELEASE" not in sent
    assert sent.count("UPDATE") >= 2 and sent.count("SELECT") <= sent.count("UPDATE")  # no reload per grant
    assert sweep_grants(env.ctx) == []
    assert events(env, "grant.expire") == 2
    with env.ctx.db.read_session() as s:
        for gid, reason in ((pending["id"], "approval timed out"), (active["id"], "ttl elapsed")):
            row, old = s.get(Grant, gid), before[gid]
            assert row is not None and old is not None
            assert row.state == "expired" and row.version == old.version + 1
            assert row.reasons == [*old.reasons, f"expired: {reason}"]
            ev = s.exec(select(AuditEvent).where(AuditEvent.action == "grant.expire",
                                                 AuditEvent.object_id == gid)).one()
            assert ev.tenant == "acme" and ev.reason == reason
    assert not live_in_policy_data(env, active["id"])
