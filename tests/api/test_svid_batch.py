"""POST /v1/svids/x509/batch (SPIRE's BatchNewX509SVID) on both real databases: each entry authorized, checked and
answered on its own (an entry refused writes nothing and changes nothing for the others), the issued ones recorded
with their audit events in one group commit, and the whole request refused, with nothing written, when it is
malformed, empty, above the bound or names a workload twice. A node principal over mTLS obtains only its own
workloads' SVIDs, and its other entries are logged as denials, as by the single route. On PostgreSQL a token revoked
from another connection is refused (401) and nothing is written."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from sqlmodel import col, func, select

from api.routes.pki import MAX_X509_BATCH, MAX_X509_BATCH_BYTES
from api.tls import prepare_server_tls
from audit import Actor
from audit.models import AuditEvent
from inventory import service as inv
from pki.models import IssuedSvid
from policy.models import DecisionRecord
from tests.api.conftest import Env, seeded_env
from tests.api.test_devices import fabric_env, node_identity
from tests.api.test_isolation import csr_pem
from tests.api.test_mtls import TlsServer, client_ctx
from tests.pki.helpers import verify_chain

BATCH = "/v1/svids/x509/batch"
SEED = Actor.system("seed")


def _counts(env: Env) -> tuple[int, int]:
    with env.ctx.db.read_session() as s:
        return (int(s.exec(select(func.count()).select_from(IssuedSvid)).one()),
                int(s.exec(select(func.count()).select_from(AuditEvent)).one()))


def _svid_events(env: Env) -> list[str]:
    with env.ctx.db.read_session() as s:
        return [e.object_id for e in s.exec(select(AuditEvent).where(AuditEvent.action == "svid.issue")
                                            .order_by(col(AuditEvent.seq))).all()]


def _denials(env: Env) -> list[str]:
    """The denied authorizations in the decision log, as tenant/group/workload, oldest first."""
    with env.ctx.db.read_session() as s:
        rows = s.exec(select(DecisionRecord).where(DecisionRecord.kind == "authz")).all()
    return ["/".join(d.input["resource"][k] for k in ("tenant", "group", "workload")) for d in rows if not d.allowed]


def _entry(tenant: str, group: str, workload: str, **extra: Any) -> dict[str, Any]:
    return {"csr": csr_pem(), "tenant": tenant, "group": group, "workload": workload, **extra}


def _verify_log(env: Env) -> None:
    from audit import checkpoint as cpm
    from audit.verify import verify_export

    key = cpm.load_public_key(env.call("GET", "/v1/audit/checkpoint", "auditor").json()["public_key"])
    r = env.call("POST", "/v1/audit/exports", "auditor", json={"format": "jsonl"})
    assert r.status_code == 200, r.text
    verify_export(io.BytesIO(r.content), key)


def test_mixed_entries_are_answered_each_and_only_the_good_ones_are_written(env_both: Env) -> None:
    env = env_both
    with env.ctx.db.session() as s:
        for name in ("web-2", "web-3", "web-4"):
            inv.register_workload(s, trust_domain="example.org", tenant="acme", group="web", name=name,
                                  actor=SEED, clock=env.clock)
        inv.register_workload(s, trust_domain="example.org", tenant="acme", group="db", name="db-1", actor=SEED,
                              clock=env.clock)
    with env.ctx.db.session() as s:
        inv.set_quarantine(s, tenant="acme", group="db", quarantined=True, actor=SEED, reason="batch test")
    denials = _denials(env)
    env.headers("admin")  # its token minted (an audit event) before counting
    before, batches = _counts(env), env.ctx.committer.batches
    entries = [
        _entry("acme", "web", "web-1"),
        {**_entry("acme", "web", "web-4"), "csr": "-----BEGIN CERTIFICATE REQUEST-----\nnot a csr\n"},  # 400
        _entry("acme", "web", "nobody"),  # not registered: 404
        _entry("globex", "api", "api-1", ttl_seconds=3600),
        _entry("acme", "web", "web-3", ttl_seconds=29 * 86400),  # above the trust domain's maximum: 400
        _entry("acme", "web", "web-2"),
        _entry("acme", "db", "db-1"),  # quarantined: 403, logged as a denial
    ]
    r = env.call("POST", BATCH, "admin", json={"svids": entries})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(entries)
    statuses = [res["error"]["status"] if res["error"] else 200 for res in results]
    assert statuses == [200, 400, 404, 200, 400, 200, 403], results
    assert "quarantined" in results[-1]["error"]["reason"]
    assert _denials(env) == [*denials, "acme/db/db-1"]
    assert all(res["error"]["reason"] for res in results if res["error"])
    good = [res["svid"] for res in results if res["svid"]]
    assert [g["spiffe_id"].rsplit("/", 1)[1] for g in good] == ["web-1", "api-1", "web-2"]
    assert _counts(env) == (before[0] + 3, before[1] + 3)  # an SVID row and an audit event for each good one
    assert _svid_events(env)[-3:] == [g["serial"] for g in good]
    assert env.ctx.committer.batches == batches + 1  # the three in one group commit
    bundle = env.client.get("/v1/bundle", params={"format": "pem"}).content
    for g in good:
        verify_chain(g["certificate"].encode(), [c.encode() for c in g["chain"]], bundle, env.clock())
    _verify_log(env)


def test_a_tenant_token_gets_its_own_entries_and_403_for_another_tenants(env_both: Env) -> None:
    """Decided: authorization is per entry, as SPIRE answers per entry: another tenant's entry is refused alone."""
    env = env_both
    env.headers("tenant-admin", "acme"), env.headers("auditor")
    before = _counts(env)
    r = env.call("POST", BATCH, "tenant-admin", "acme", json={"svids": [
        _entry("globex", "api", "api-1"), _entry("acme", "web", "web-1")]})
    assert r.status_code == 200, r.text
    other, own = r.json()["results"]
    assert other["svid"] is None and other["error"]["status"] == 403 and other["error"]["reason"]
    assert own["error"] is None and own["svid"]["spiffe_id"].endswith("/tenant/acme/group/web/web-1")
    assert _counts(env) == (before[0] + 1, before[1] + 1)
    # a role that may issue nothing: every entry refused, nothing written
    r = env.call("POST", BATCH, "auditor", json={"svids": [_entry("acme", "web", "web-1")]})
    assert r.status_code == 200 and r.json()["results"][0]["error"]["status"] == 403
    assert _counts(env) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("body, reason", [
    ({"svids": []}, "at least 1"),
    ({"svids": [_entry("acme", "web", "web-1")] * (MAX_X509_BATCH + 1)}, f"at most {MAX_X509_BATCH}"),
    ({"svids": [_entry("acme", "web", "web-1"), _entry("acme", "web", "web-1")]}, "more than once"),
    ({"svids": [{**_entry("acme", "web", "web-1"), "tenant": "Not A Slug"}]}, "tenant"),
    ({"svids": [{**_entry("acme", "web", "web-1"), "extra": 1}]}, "extra"),
    ({}, "svids"),
], ids=["empty", "above-the-bound", "twice", "bad-slug", "unknown-field", "no-list"])
def test_a_request_refused_whole_writes_nothing(env: Env, body: dict[str, Any], reason: str) -> None:
    env.headers("admin")
    before = _counts(env)
    r = env.call("POST", BATCH, "admin", json=body)
    assert r.status_code == 422, r.text
    assert reason in r.json()["reason"] or reason in str(r.json()["problems"]), r.json()
    assert _counts(env) == before
    r = env.client.post(BATCH, json=body)  # unauthenticated comes first
    assert r.status_code == 401
    assert _counts(env) == before


def _rsa_csr() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def test_the_bound_itself_is_one_request_above_the_apis_usual_body_limit(env: Env) -> None:
    """100 entries with RSA-3072 CSRs make a body over the API's 64 KiB limit: the batch route has a larger one
    (MAX_X509_BATCH_BYTES), and a body above that is 413 with nothing written."""
    with env.ctx.db.session() as s:
        for n in range(MAX_X509_BATCH):
            inv.register_workload(s, trust_domain="example.org", tenant="acme", group="db", name=f"d{n}",
                                  actor=SEED, clock=env.clock)
    env.headers("admin")
    before = _counts(env)
    csr = _rsa_csr()
    body = {"svids": [{**_entry("acme", "db", f"d{n}"), "csr": csr} for n in range(MAX_X509_BATCH)]}
    assert env.ctx.settings.max_body_bytes < len(json.dumps(body)) < MAX_X509_BATCH_BYTES
    r = env.call("POST", BATCH, "admin", json=body)
    assert r.status_code == 200, r.text
    assert all(res["svid"] for res in r.json()["results"])
    assert _counts(env) == (before[0] + MAX_X509_BATCH, before[1] + MAX_X509_BATCH)
    padded = {"svids": [{**entry, "csr": entry["csr"] + " " * 4096} for entry in body["svids"]]}
    r = env.call("POST", BATCH, "admin", json=padded)
    assert r.status_code == 413, r.text
    assert _counts(env) == (before[0] + MAX_X509_BATCH, before[1] + MAX_X509_BATCH)


def test_the_route_is_in_the_openapi_document(env: Env) -> None:
    doc = env.client.get("/openapi.json").json()
    op = doc["paths"][BATCH]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/X509SvidBatchRequest")
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/X509SvidBatchOut")
    schemas = doc["components"]["schemas"]
    assert schemas["X509SvidBatchRequest"]["properties"]["svids"]["maxItems"] == MAX_X509_BATCH
    assert {"svid", "error"} <= set(schemas["X509SvidBatchResult"]["properties"])


def _count(env: Any, model: Any) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(model)).one())


def test_a_node_obtains_in_a_batch_only_its_own_workloads(tmp_path: Path) -> None:
    env = fabric_env(tmp_path / "home", running=False)
    tls = prepare_server_tls(env.ctx)
    server = TlsServer(env, tls)
    try:
        cert, key = node_identity(env, tmp_path, "gpu1")
        with httpx.Client(base_url=f"https://localhost:{server.port}", verify=client_ctx(tls, cert, key),
                          timeout=10) as gpu1:
            svids, events = _count(env, IssuedSvid), _count(env, AuditEvent)
            r = gpu1.post(BATCH, json={"svids": [
                _entry("globex", "api", "a1"),  # placed on gpu3
                _entry("acme", "train", "w1"),  # its own
                _entry("acme", "train", "nobody"),  # not registered: the same answer as another node's
            ]})
            assert r.status_code == 200, r.text
            other, own, nobody = r.json()["results"]
            assert own["svid"]["spiffe_id"].endswith("/tenant/acme/group/train/w1")
            for refused in (other, nobody):
                assert refused["svid"] is None and refused["error"]["status"] == 403
                assert "out-of-scope" in refused["error"]["reason"]
            assert (_count(env, IssuedSvid), _count(env, AuditEvent)) == (svids + 1, events + 1)
            with env.ctx.db.read_session() as s:
                denied = [d for d in s.exec(select(DecisionRecord).where(DecisionRecord.kind == "authz")).all()
                          if not d.allowed]
            assert sorted("/".join(d.input["resource"][k] for k in ("tenant", "group", "workload"))
                          for d in denied) == ["acme/train/nobody", "globex/api/a1"]
            assert all(d.input["resource"]["kind"] == "x509" and d.input["action"] == "svid.issue" for d in denied)
    finally:
        server.stop()
        tls.cleanup()
        env.client.close()
        env.ctx.close()


@pytest.mark.postgres
def test_a_token_revoked_elsewhere_is_401_and_nothing_is_written(postgres_server: Any, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    with seeded_env(tmp_path / "home", url) as env:
        token = env.token("tenant-admin", "acme")
        headers = {"Authorization": f"Bearer {token}"}
        body = {"svids": [_entry("acme", "web", "web-1")]}
        assert env.client.post(BATCH, json=body, headers=headers).status_code == 200
        before = _counts(env)
        with psycopg.connect(url, autocommit=True) as conn:  # as another replica would
            conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE id = %s",
                         (jwt.decode(token, options={"verify_signature": False})["jti"],))
        for path, b in ((BATCH, body), ("/v1/svids/x509", body["svids"][0])):
            r = env.client.post(path, json=b, headers=headers)
            assert r.status_code == 401 and "revoked" in r.json()["reason"], r.text
        assert _counts(env) == before


# ---------------------------------------------------------------- the rate limit: one token per entry


def _register(env: Env, group: str, names: list[str]) -> None:
    with env.ctx.db.session() as s:
        for name in names:
            inv.register_workload(s, trust_domain="example.org", tenant="acme", group=group, name=name, actor=SEED,
                                  clock=env.clock)


def _decisions(env: Env) -> int:
    return _count(env, DecisionRecord)


def test_a_batch_is_charged_one_rate_limit_token_per_entry(tmp_path: Path) -> None:
    """A batch takes one token per entry, all or none, before any work: without enough of them it is 429 whole, with
    Retry-After until all are there, nothing issued, written or decided; after that wait it passes. A batch of exactly
    the burst passes on a full bucket; one above the burst can never pass: 422 naming the burst."""
    import time

    burst = 5
    with seeded_env(tmp_path / "home", rate_limit_per_second=1.0, rate_limit_burst=burst) as env:
        names = [f"w{n}" for n in range(burst + 1)]
        _register(env, "web", names)
        env.headers("admin"), env.headers("tenant-admin", "acme")  # minted (audit events) before counting
        r = env.call("POST", BATCH, "admin", json={"svids": [_entry("acme", "web", n) for n in names[:3]]})
        assert r.status_code == 200 and all(res["svid"] for res in r.json()["results"]), r.text  # 2 tokens left
        before, decisions = _counts(env), _decisions(env)
        four = {"svids": [_entry("acme", "web", n) for n in names[:4]]}
        r = env.call("POST", BATCH, "admin", json=four)
        assert r.status_code == 429, r.text
        assert "4 entries cost 4 tokens" in r.json()["reason"], r.json()
        retry = int(r.headers["retry-after"])
        assert 1 <= retry <= 2, retry  # 2 tokens there (the refused request's own went back), 2 more at 1/s
        assert _counts(env) == before and _decisions(env) == decisions  # nothing issued, written, or decided
        time.sleep(retry)
        r = env.call("POST", BATCH, "admin", json=four)
        assert r.status_code == 200 and all(res["svid"] for res in r.json()["results"]), r.text
        assert _counts(env) == (before[0] + 4, before[1] + 4)
        # exactly the burst, on a fresh bucket (another principal's): passes, and leaves nothing for more
        whole = {"svids": [_entry("acme", "web", n) for n in names[:burst]]}
        r = env.call("POST", BATCH, "tenant-admin", "acme", json=whole)
        assert r.status_code == 200 and all(res["svid"] for res in r.json()["results"]), r.text
        assert env.call("GET", "/v1/whoami", "tenant-admin", "acme").status_code == 429
        # above the burst: never passes, so not 429 (whose Retry-After would promise it could)
        env.headers("auditor")
        before = _counts(env)
        r = env.call("POST", BATCH, "auditor", json={"svids": [_entry("acme", "web", n) for n in names]})
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "batch_above_burst" and f"burst of {burst}" in r.json()["reason"], r.json()
        assert "retry-after" not in r.headers
        assert _counts(env) == before


def test_a_revoked_tokens_batches_never_drain_the_bucket_of_the_principal_it_names(tmp_path: Path) -> None:
    """A revoked token is refused (401) before its batch is charged anything: replayed, it must not lock the principal
    it names out (the owner's good token still has the whole burst)."""
    from pki.tokens.service import revoke_token

    burst = 5
    with seeded_env(tmp_path / "home", rate_limit_per_second=0.001, rate_limit_burst=burst) as env:
        _register(env, "web", [f"w{n}" for n in range(burst)])
        bad = env.token("tenant-admin", "acme", subject="alice")
        good = env.token("tenant-admin", "acme", subject="alice")
        with env.ctx.db.session() as s:
            revoke_token(s, jwt.decode(bad, options={"verify_signature": False})["jti"], actor=SEED, reason="leaked")
        body = {"svids": [_entry("acme", "web", f"w{n}") for n in range(burst)]}
        before = _counts(env)
        for _ in range(3):
            r = env.client.post(BATCH, json=body, headers={"Authorization": f"Bearer {bad}"})
            assert r.status_code == 401 and "revoked" in r.json()["reason"], r.text
        assert _counts(env) == before
        r = env.client.post(BATCH, json=body, headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 200 and all(res["svid"] for res in r.json()["results"]), r.text  # the whole burst
        r = env.client.get("/v1/whoami", headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 429  # and the limit still holds
