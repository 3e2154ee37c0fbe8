"""The audit routes through the real app: scoping by principal, paging, proofs that verify, exports."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from audit import Actor, merkle, record
from audit import checkpoint as cpm
from audit.models import AuditEvent
from audit.verify import verify_export
from tests.api.conftest import Env, make_settings, open_env, seed


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = open_env(make_settings(tmp_path / "home"))
    cpm.ensure_audit_key(e.ctx.keystore)
    seed(e)
    with e.ctx.db.session() as s:
        for i in range(30):
            record(
                s,
                actor=Actor("op", "admin"),
                action="flow.allow" if i % 2 else "grant.approve",
                object_type="grant",
                object_id=f"g-{i}",
                tenant=("acme", "globex")[i % 2],
                summary={"i": i},
            )
    yield e
    e.client.close()
    e.ctx.close()


def _count(env: Env, **where: str) -> int:
    with env.ctx.db.read_session() as s:
        stmt = select(AuditEvent.seq)
        for k, v in where.items():
            stmt = stmt.where(getattr(AuditEvent, k) == v)
        return len(s.exec(stmt).all())


def _pages(env: Env, role: str, scope: str | None = None, **params: object) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    cursor = None
    while True:
        q = {**params, "limit": 7, **({"cursor": cursor} if cursor else {})}
        r = env.call("GET", "/v1/audit/events", role, scope, params=q)
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if not cursor:
            return items


def test_platform_roles_read_everything_and_page(env: Env) -> None:
    for role in ("admin", "auditor", "security"):
        env.headers(role)  # minting a token is itself audited: mint first, then count
    total = _count(env)
    for role in ("admin", "auditor", "security"):
        items = _pages(env, role)
        assert [e["seq"] for e in items] == list(range(total))
    acme = _pages(env, "auditor", tenant="acme", action="grant.approve")
    assert acme and all(e["tenant"] == "acme" and e["action"] == "grant.approve" for e in acme)


def test_a_tenant_reads_only_its_own_events(env: Env) -> None:
    env.headers("tenant-admin", "acme")
    items = _pages(env, "tenant-admin", "acme")
    assert items and {e["tenant"] for e in items} == {"acme"}
    assert len(items) == _count(env, tenant="acme")
    r = env.call("GET", "/v1/audit/events", "tenant-admin", "acme", params={"tenant": "globex"})
    assert r.status_code == 403
    assert env.call("GET", "/v1/audit/events", "tenant-member", "acme").status_code == 403  # policy: no audit.read
    assert env.client.get("/v1/audit/events").status_code == 401


def test_bad_queries_are_4xx(env: Env) -> None:
    for params in (
        {"cursor": "!!"},
        {"limit": 0},
        {"tenant": "Not A Slug"},
        {"since": "2026-01-01T00:00:00"},
        {"action": "nodot"},
    ):
        r = env.call("GET", "/v1/audit/events", "auditor", params=params)
        assert r.status_code in (400, 422), (params, r.text)


def test_checkpoint_and_proofs_verify(env: Env) -> None:
    env.headers("auditor")
    r = env.call("GET", "/v1/audit/checkpoint", "auditor")
    assert r.status_code == 200, r.text
    body = r.json()
    key = cpm.load_public_key(body["public_key"])
    cp = cpm.verify_checkpoint(body["note"], key)
    assert cp.size == _count(env) and cp.origin == "example.org/audit"
    for index in (0, 5, cp.size - 1):
        p = env.call("GET", "/v1/audit/proof/inclusion", "auditor", params={"index": index}).json()
        assert p["checkpoint"] == body["note"]
        merkle.verify_inclusion(
            index, p["tree_size"], base64.b64decode(p["leaf_hash"]), [base64.b64decode(h) for h in p["proof"]], cp.root
        )
    with env.ctx.db.session() as s:
        record(s, actor=Actor("op", "admin"), action="tenant.update", object_type="tenant", object_id="acme")
    c = env.call("GET", "/v1/audit/proof/consistency", "auditor", params={"first": cp.size, "second": cp.size + 1})
    assert c.status_code == 200, c.text
    c = c.json()
    assert base64.b64decode(c["first_root"]) == cp.root
    merkle.verify_consistency(
        cp.size, cp.size + 1, cp.root, base64.b64decode(c["second_root"]), [base64.b64decode(h) for h in c["proof"]]
    )
    bad = env.call("GET", "/v1/audit/proof/consistency", "auditor", params={"first": 5, "second": 10**9})
    assert bad.status_code == 400
    assert env.call("GET", "/v1/audit/proof/inclusion", "auditor", params={"index": 10**9}).status_code == 404


def test_a_tenant_gets_proofs_only_for_its_events(env: Env) -> None:
    env.call("GET", "/v1/audit/checkpoint", "auditor")
    with env.ctx.db.read_session() as s:
        acme = s.exec(select(AuditEvent).where(AuditEvent.tenant == "acme")).first()
        globex = s.exec(select(AuditEvent).where(AuditEvent.tenant == "globex")).first()
    assert acme is not None and globex is not None
    ok = env.call("GET", "/v1/audit/proof/inclusion", "tenant-admin", "acme", params={"index": acme.seq})
    assert ok.status_code == 200
    hidden = env.call("GET", "/v1/audit/proof/inclusion", "tenant-admin", "acme", params={"index": globex.seq})
    assert hidden.status_code == 404


def test_export_streams_a_verifiable_file_and_is_itself_audited(env: Env) -> None:
    env.headers("auditor")
    before = _count(env, action="audit.export")
    globex = _count(env, tenant="globex")
    r = env.call("POST", "/v1/audit/exports", "auditor", json={"format": "jsonl", "tenant": "globex"})
    assert r.status_code == 200, r.text
    key = cpm.load_public_key(env.call("GET", "/v1/audit/checkpoint", "auditor").json()["public_key"])
    report = verify_export(io.BytesIO(r.content), key)
    assert report.events == globex  # the export's own event is written once the export exists
    assert _count(env, action="audit.export") == before + 1
    for fmt in ("csv", "ocsf"):
        r = env.call("POST", "/v1/audit/exports", "admin", json={"format": fmt})
        assert r.status_code == 200 and verify_export(io.BytesIO(r.content), key).tree_size > 0


def test_a_tenant_export_is_confined_to_the_tenant(env: Env) -> None:
    env.headers("tenant-admin", "acme")  # minting the token is audited (in acme): mint, then count
    acme = _count(env, tenant="acme")
    r = env.call("POST", "/v1/audit/exports", "tenant-admin", "acme", json={"format": "jsonl"})
    assert r.status_code == 200, r.text
    key = cpm.public_key_pem(cpm.audit_signer(env.ctx.keystore))
    report = verify_export(io.BytesIO(r.content), cpm.load_public_key(key))
    assert report.filter["tenant"] == "acme" and report.events == acme
    r = env.call("POST", "/v1/audit/exports", "tenant-admin", "acme", json={"tenant": "globex"})
    assert r.status_code == 403


def test_bad_export_request_writes_nothing(env: Env) -> None:
    env.headers("auditor"), env.headers("security")
    before = _count(env)
    for body in (
        {"format": "xml"},
        {"tenant": "BAD"},
        {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        {"unknown": 1},
        {"since_checkpoint": "not a signed note"},
        {"since_checkpoint": cpm.sign_checkpoint(cpm.audit_signer(env.ctx.keystore), "other.org/audit", 1, bytes(32))},
    ):
        r = env.call("POST", "/v1/audit/exports", "auditor", json=body)
        assert r.status_code in (400, 422), (body, r.text)
    assert env.call("POST", "/v1/audit/exports", "security", json={}).status_code == 403  # policy: no audit.export
    assert _count(env) == before


def test_an_export_since_a_kept_checkpoint_carries_the_consistency_proof(env: Env) -> None:
    """A tenant export (gap hashes where the kept tree ends) proves it extends the checkpoint kept earlier."""
    env.headers("auditor")
    kept = env.call("GET", "/v1/audit/checkpoint", "auditor").json()
    key = cpm.load_public_key(kept["public_key"])
    note = cpm.verify_checkpoint(kept["note"], key)
    assert note.time is not None  # the checkpoint carries its signed time
    with env.ctx.db.session() as s:
        for i in range(9):
            record(s, actor=Actor("op", "admin"), action="grant.approve", object_type="g", object_id=f"x{i}",
                   tenant="globex")
    r = env.call("POST", "/v1/audit/exports", "auditor", json={"tenant": "globex", "since_checkpoint": kept["note"]})
    assert r.status_code == 200, r.text
    report = verify_export(io.BytesIO(r.content), key, since=note)
    assert report.tree_size > note.size and report.events >= 9
