"""The grant decider keeps its data document and rebuilds it only when build_data would read different
rows (policy.data.data_fingerprint, read in the decision's own transaction): a change committed by
another connection or another process, or made earlier in the same transaction, is seen by the next
decision; a grant in the kept document that expires forces a rebuild; and every input of build_data
is in the fingerprint."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session, select

from inventory.models import Tenant, Workload, WorkloadGroup
from pki.models import RevokedIdentity
from policy import grants as svc
from policy.data import build_data, data_fingerprint
from policy.grant_decider import RegoGrantDecider
from policy.models import Grant
from store.db import Database
from tests.api.conftest import Env

REQ = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
       "ttl_seconds": 3600, "justification": "perf cache"}
INPUT = {"requester": {"tenant": "acme"}, "src": {"tenant": "acme", "group": "web"},
         "dst": {"tenant": "globex", "group": "api"}, "proto": "tcp", "ports": [443], "ttl_seconds": 3600}


def decider(env: Env) -> RegoGrantDecider:
    d = env.app.state.grant_decider
    assert isinstance(d, RegoGrantDecider)
    return d


def post(env: Env, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=body or REQ)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def db_path(env: Env) -> str:
    url = env.ctx.db.url
    assert url.startswith("sqlite:///")
    return url[len("sqlite:///"):]


def in_another_process(env: Env, sql: str) -> None:
    """Commit `sql` from a separate process (its own SQLite connection), like another worker or the CLI."""
    code = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=30); "
            "c.executescript(sys.argv[2]); c.commit(); c.close()")
    subprocess.run([sys.executable, "-c", code, db_path(env), sql], check=True, timeout=60)


def test_pending_requests_reuse_the_document_and_another_process_commit_is_seen(env: Env) -> None:
    d = decider(env)
    assert post(env)["state"] == "pending"
    built = d.rebuilds
    for _ in range(3):  # pending grants, audit events, decision log rows: nothing build_data reads
        assert post(env)["state"] == "pending"
    assert d.rebuilds == built

    in_another_process(env, "UPDATE tenants SET quarantined = 1 WHERE slug = 'globex';")
    g = post(env)
    assert g["state"] == "denied"
    assert "quarantined: destination tenant globex is quarantined" in g["reasons"]
    assert d.rebuilds == built + 1

    in_another_process(env, "UPDATE tenants SET quarantined = 0 WHERE slug = 'globex'; "
                            "UPDATE workload_groups SET labels = '{\"grants.trustfabric.io/auto-approve\": \"true\"}' "
                            "WHERE tenant = 'globex' AND name = 'api';")
    assert post(env)["state"] == "active"


def test_a_commit_by_another_connection_in_this_process_is_seen(env: Env) -> None:
    assert post(env)["state"] == "pending"
    other = Database(env.ctx.db.url)
    try:
        with other.session() as s:
            group = s.exec(select(WorkloadGroup).where(WorkloadGroup.tenant == "globex",
                                                       WorkloadGroup.name == "api")).one()
            group.quarantined = True
            s.add(group)
    finally:
        other.dispose()
    g = post(env)
    assert g["state"] == "denied" and "quarantined: group globex/api is quarantined" in g["reasons"]


def test_an_uncommitted_change_in_the_same_transaction_is_seen_and_a_rollback_is_not_kept(env: Env) -> None:
    d = decider(env)
    now = env.clock()
    with env.ctx.db.session() as s:
        assert d(s, now, INPUT).outcome == "pending"
    with pytest.raises(RuntimeError), env.ctx.db.session() as s:
        tenant = s.get(Tenant, "globex")
        assert tenant is not None
        tenant.quarantined = True
        s.add(tenant)  # not flushed: the decision must see it anyway
        decision = d(s, now, INPUT)
        assert decision.outcome == "deny" and any("quarantined" in r for r in decision.reasons)
        raise RuntimeError("roll back")
    with env.ctx.db.session() as s:  # the rolled-back quarantine is not in the document any more
        assert d(s, now, INPUT).outcome == "pending"


def test_the_kept_document_is_rebuilt_when_a_grant_in_it_expires(env: Env) -> None:
    d = decider(env)
    g = post(env, dict(REQ, dst_group="public", ports=[80], ttl_seconds=60))
    assert g["state"] == "active"
    post(env)
    built = d.rebuilds
    post(env)
    assert d.rebuilds == built
    kept = d._kept
    assert kept is not None and g["id"] in kept.data["tf"]["grants"]["acme"]["globex"]
    env.clock.advance(timedelta(seconds=60))  # expires_at reached: no longer live, though still `active`
    post(env)
    assert d.rebuilds == built + 1
    kept = d._kept
    assert kept is not None and kept.data["tf"]["grants"] == {}
    with env.ctx.db.read_session() as s:
        assert kept.data == build_data(s, env.clock())


def _grant(s: Session, state: str, env: Env, **over: Any) -> Grant:
    now = env.clock()
    values: dict[str, Any] = dict(
        id=svc.new_grant_id(now), src_tenant="acme", src_group="web", dst_tenant="globex", dst_group="api",
        proto="tcp", ports=[443], ttl_seconds=3600, state=state, requested_by="t", requester_tenant="acme",
        required_approvers=[], approvals=[], reasons=[], created_at=now,
        expires_at=now + timedelta(hours=1) if state == "active" else None,
    )
    values.update(over)
    return Grant(**values)


def _set(model: Any, where: Any, **values: Any) -> Callable[[Session], None]:
    def go(s: Session) -> None:
        row = s.exec(select(model).where(where)).one()
        for k, v in values.items():
            setattr(row, k, v)
        s.add(row)
    return go


def test_every_input_of_build_data_is_in_the_fingerprint(env_both: Env) -> None:
    """Each change build_data sees changes the fingerprint; changes it does not see leave it alone (on both
    databases: the fingerprint is a counter their triggers bump)."""
    env = env_both
    with env.ctx.db.session() as s:
        s.add(_grant(s, "active", env, id="g-active-1"))
    api = WorkloadGroup.name == "api"
    web = Workload.name == "web-1"
    now = env.clock()
    changes: list[tuple[str, Callable[[Session], None], bool]] = [
        ("tenant quarantined", _set(Tenant, Tenant.slug == "globex", quarantined=True), True),
        ("tenant added", lambda s: s.add(Tenant(slug="initech", display_name="I", created_at=now)), True),
        ("group labels", _set(WorkloadGroup, api, labels={"sensitive": "true"}), True),
        ("group ports", _set(WorkloadGroup, api, ports=[{"proto": "tcp", "port": 444}]), True),
        ("group sensitivity", _set(WorkloadGroup, api, sensitivity="sensitive"), True),
        ("group quarantined", _set(WorkloadGroup, api, quarantined=True), True),
        ("group added", lambda s: s.add(WorkloadGroup(tenant="acme", name="new", labels={}, ports=[],
                                                      created_at=now)), True),
        ("workload revoked", _set(Workload, web, revoked=True), True),
        ("identity revoked", lambda s: s.add(RevokedIdentity(
            spiffe_id_prefix="spiffe://example.org/tenant/acme/group/web/", tenant="acme", group="web",
            reason="r", revoked_at=now, revoked_by="t")), True),
        ("grant activated", lambda s: s.add(_grant(s, "active", env)), True),
        ("active grant ports", _set(Grant, Grant.id == "g-active-1", ports=[443, 8443]), True),
        ("active grant expiry", _set(Grant, Grant.id == "g-active-1", expires_at=now + timedelta(hours=2)), True),
        ("active grant revoked", _set(Grant, Grant.id == "g-active-1", state="revoked"), True),
        ("pending grant added", lambda s: s.add(_grant(s, "pending", env)), False),
        ("active grant justification", _set(Grant, Grant.id == "g-active-1", justification="other"), False),
        ("workload added", lambda s: s.add(Workload(tenant="acme", group="web", name="web-2", created_at=now,
                                                     spiffe_id="spiffe://example.org/tenant/acme/group/web/web-2")),
         False),
    ]
    for name, change, seen in changes:
        with pytest.raises(RuntimeError), env.ctx.db.session() as s:
            before_fp, before = data_fingerprint(s), build_data(s, now)
            change(s)
            after_fp, after = data_fingerprint(s), build_data(s, now)
            assert before_fp is not None
            assert (after != before) is seen, name
            assert (after_fp != before_fp) is seen, name
            raise RuntimeError("roll back")


def test_write_requests_reuse_the_document_on_postgresql_too(env_both: Env) -> None:
    """On PostgreSQL a POST runs READ COMMITTED, whose statements are not one snapshot: the document is built
    in a REPEATABLE READ transaction beside it and kept (it was rebuilt on every request before, issue 11)."""
    from sqlmodel import col, update

    from inventory.models import Tenant

    env = env_both
    d = decider(env)
    assert post(env)["state"] == "pending"
    built = d.rebuilds
    for _ in range(3):
        assert post(env)["state"] == "pending"
    assert d.rebuilds == built
    other = Database(env.ctx.db.url)  # another worker or replica
    try:
        with other.session() as s:
            s.exec(update(Tenant).where(col(Tenant.slug) == "globex").values(quarantined=True))
    finally:
        other.dispose()
    g = post(env)
    assert g["state"] == "denied" and d.rebuilds == built + 1


def test_decisions_load_the_active_version_without_its_tests(env: Env) -> None:
    """The decider's engine holds the active version's policy modules, not its *_test.rego ones: regorus prepares
    every rule it holds after each change of the data, and no decision reads a test."""
    from policy.models import PolicyVersion

    post(env)
    with env.ctx.db.read_session() as s:
        active = s.exec(select(PolicyVersion).where(PolicyVersion.state == "active")).one()
    tests = {p for p in active.modules if p.endswith("_test.rego")}
    engine = decider(env).engine
    assert tests and engine is not None
    assert set(engine.modules()) == set(active.modules) - tests


def test_grant_decisions_go_through_the_compiled_vm(env: Env) -> None:
    """The decider's engine answers data.grants.decision through regorus's compiled VM (policy/engines/rvm.py) on
    the shipped policy that init activates: no fallback for a well-formed request."""
    from policy.engines.embedded import RegorusEngine

    first = post(env)
    engine = decider(env).engine
    assert isinstance(engine, RegorusEngine) and engine.accelerator is not None
    stats = engine.accelerator.stats()
    assert stats["vm_answers"] >= 1 and stats["vm_errors"] == stats["not_compiled"] == 0, stats
    assert first["state"] == "pending"
    again = post(env)
    assert again["state"] == "pending"
    assert engine.accelerator.stats()["vm_answers"] + engine.accelerator.stats()["stale_data"] >= 2
