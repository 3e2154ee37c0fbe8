"""Tenant isolation, enumerated from the OpenAPI document: every operation is classified below, and an
operation without a classification fails the test, so a new endpoint cannot be forgotten.

For each operation, principals of tenant A (acme: tenant-admin, tenant-member) address tenant B's
(globex) objects or scope. They must get 403/404 (or, for self-scoped listings, see nothing of B), and
nothing may be written anywhere (audit log and every table unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import inspect, text

from audit import Actor
from inventory.service import create_group, create_tenant
from pki.service import issue_x509_svid
from tests.api.conftest import Env

A, B = "acme", "globex"
FORBIDDEN = frozenset({403, 404})


def csr_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    ).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class Case:
    kind: str  # public | global (no tenant data) | platform | on_b | on_b_entries (a batch) | own_scope | credential
    path: str = ""
    body: Callable[[dict[str, str]], Any] | None = None
    expect: frozenset[int] = FORBIDDEN


def on_b(path: str, body: Callable[[dict[str, str]], Any] | None = None) -> Case:
    return Case("on_b", path, body)


def platform(path: str, body: Callable[[dict[str, str]], Any] | None = None) -> Case:
    return Case("platform", path, body, frozenset({403}))


PUBLIC = Case("public")
REASON = {"reason": "isolation test"}
MODULES = {"modules": {"x.rego": "package x\n\ndefault allow := false\n"}}
# Tables a tenant's read may legitimately append to: signed checkpoints of the audit log (system state,
# no tenant data) are written on demand by GET /v1/audit/checkpoint.
SYSTEM_TABLES = {"audit_checkpoints"}

# "METHOD /path" -> how tenant A attacks tenant B through it. {grant}: a grant between B and a third
# tenant; {serial}: an SVID of B; {token}: an API token id of B.
CASES: dict[str, Case] = {
    "GET /healthz": PUBLIC,
    "GET /v1/bundle": PUBLIC,
    "GET /v1/crl": PUBLIC,
    # pki
    "POST /v1/svids/x509": on_b("/v1/svids/x509", lambda o: {
        "csr": o["csr"], "tenant": B, "group": "api", "workload": "api-1"}),
    # a batch answers 200 with a result per entry: each of B's entries must be refused (403/404 with a reason)
    "POST /v1/svids/x509/batch": Case("on_b_entries", "/v1/svids/x509/batch", lambda o: {"svids": [
        {"csr": o["csr"], "tenant": B, "group": "api", "workload": "api-1"},
        {"csr": o["csr"], "tenant": B, "group": "api", "workload": "nobody"}]}),
    "POST /v1/svids/jwt": on_b("/v1/svids/jwt", lambda o: {
        "tenant": B, "group": "api", "workload": "api-1", "audience": ["trustfabric-api"]}),
    "POST /v1/svids/revoke": on_b("/v1/svids/revoke", lambda o: {"serial": o["serial"], **REASON}),
    "GET /v1/revocations": platform("/v1/revocations"),
    "POST /v1/nodes/tokens": platform("/v1/nodes/tokens", lambda o: {"node_name": "n1"}),
    "POST /v1/nodes/attest": Case("credential", "/v1/nodes/attest", lambda o: {
        "token": "not-a-join-token", "csr": o["csr"]}, frozenset({400, 401, 403, 404})),
    "POST /v1/nodes/renew": platform("/v1/nodes/renew", lambda o: {"csr": o["csr"]}),
    "GET /v1/ca/status": platform("/v1/ca/status"),
    "POST /v1/ca/rotate": platform("/v1/ca/rotate", lambda o: {"force": True}),
    # inventory
    "POST /v1/tenants": platform("/v1/tenants", lambda o: {"slug": "evil", "display_name": "Evil"}),
    "GET /v1/tenants": Case("own_scope", "/v1/tenants"),
    "GET /v1/tenants/{tenant}": on_b(f"/v1/tenants/{B}"),
    "POST /v1/tenants/{tenant}/groups": on_b(f"/v1/tenants/{B}/groups", lambda o: {"name": "evil"}),
    "GET /v1/tenants/{tenant}/groups": on_b(f"/v1/tenants/{B}/groups"),
    "GET /v1/tenants/{tenant}/groups/{group}": on_b(f"/v1/tenants/{B}/groups/api"),
    "POST /v1/tenants/{tenant}/groups/{group}/workloads": on_b(
        f"/v1/tenants/{B}/groups/api/workloads", lambda o: {"name": "evil"}),
    "GET /v1/tenants/{tenant}/workloads": on_b(f"/v1/tenants/{B}/workloads"),
    "GET /v1/tenants/{tenant}/groups/{group}/workloads/{name}": on_b(f"/v1/tenants/{B}/groups/api/workloads/api-1"),
    # security
    "POST /v1/tenants/{tenant}/quarantine": on_b(f"/v1/tenants/{B}/quarantine", lambda o: REASON),
    "POST /v1/tenants/{tenant}/unquarantine": on_b(f"/v1/tenants/{B}/unquarantine", lambda o: REASON),
    "POST /v1/tenants/{tenant}/groups/{group}/quarantine": on_b(f"/v1/tenants/{B}/groups/api/quarantine",
                                                               lambda o: REASON),
    "POST /v1/tenants/{tenant}/groups/{group}/unquarantine": on_b(f"/v1/tenants/{B}/groups/api/unquarantine",
                                                                 lambda o: REASON),
    "POST /v1/tenants/{tenant}/groups/{group}/workloads/{name}/revoke": on_b(
        f"/v1/tenants/{B}/groups/api/workloads/api-1/revoke", lambda o: REASON),
    # grants: creating in B's scope, and B's grant with a third tenant
    "POST /v1/grants": on_b("/v1/grants", lambda o: {
        "src_tenant": B, "src_group": "api", "dst_tenant": "initech", "dst_group": "svc", "proto": "tcp",
        "ports": [443], "ttl_seconds": 3600}),
    "GET /v1/grants": Case("own_scope", "/v1/grants"),
    "GET /v1/grants/{grant_id}": on_b("/v1/grants/{grant}"),
    "POST /v1/grants/{grant_id}/approve": on_b("/v1/grants/{grant}/approve"),
    "POST /v1/grants/{grant_id}/reject": on_b("/v1/grants/{grant}/reject", lambda o: REASON),
    "POST /v1/grants/{grant_id}/revoke": on_b("/v1/grants/{grant}/revoke", lambda o: REASON),
    # audit: B's events by filter, by index, by export; proofs and checkpoints carry hashes only
    "GET /v1/audit/events": on_b(f"/v1/audit/events?tenant={B}"),
    "GET /v1/audit/events/{seq}": on_b("/v1/audit/events/{b_event}"),
    "GET /v1/audit/proof/inclusion": on_b("/v1/audit/proof/inclusion?index={b_event}"),
    "GET /v1/audit/proof/consistency": Case("global", "/v1/audit/proof/consistency?first=1&second=2"),
    "GET /v1/audit/checkpoint": Case("global"),
    "POST /v1/audit/exports": on_b("/v1/audit/exports", lambda o: {"format": "jsonl", "tenant": B}),
    # policy: platform-wide except explain (own flows only) and decisions
    "POST /v1/policy/validate": platform("/v1/policy/validate", lambda o: MODULES),
    "POST /v1/policy/test": platform("/v1/policy/test", lambda o: MODULES),
    "POST /v1/policy/versions": platform("/v1/policy/versions", lambda o: MODULES),
    "GET /v1/policy/versions": platform("/v1/policy/versions"),
    "GET /v1/policy/active": platform("/v1/policy/active"),
    "GET /v1/policy/versions/{ref}": platform("/v1/policy/versions/1"),
    "GET /v1/policy/versions/{ref}/impact": platform("/v1/policy/versions/1/impact"),
    "POST /v1/policy/versions/{ref}/activate": platform("/v1/policy/versions/1/activate", lambda o: {}),
    "POST /v1/policy/versions/{ref}/rollback": platform("/v1/policy/versions/1/rollback", lambda o: {}),
    "GET /v1/policy/explain": on_b(f"/v1/policy/explain?src={B}/api&dst=initech/svc&port=443"),
    "GET /v1/policy/decisions": on_b(f"/v1/policy/decisions?tenant={B}"),
    "GET /v1/policy/flows/matrix": platform("/v1/policy/flows/matrix"),
    "GET /v1/policy/flows": platform(f"/v1/policy/flows?src_tenant={B}&dst_tenant={B}"),
    "GET /v1/policy/explain-grant": on_b(f"/v1/policy/explain-grant?src_tenant={B}&src_group=api&dst_tenant=initech"
                                         "&dst_group=svc&proto=tcp&ports=443&ttl_seconds=60"),
    # fabric and devices: platform state (which node hosts what, every device's rules), never a tenant's
    "GET /v1/fabric": platform("/v1/fabric"),
    "POST /v1/fabric/import": platform("/v1/fabric/import", lambda o: {"yaml": "trust_domain: example.org\n"}),
    "POST /v1/fabric/nodes": platform("/v1/fabric/nodes", lambda o: {"name": "n9", "uplinks": ["p0"]}),
    "DELETE /v1/fabric/nodes/{name}": platform("/v1/fabric/nodes/gpu1"),
    "POST /v1/fabric/leaves": platform("/v1/fabric/leaves", lambda o: {"name": "l9", "ports": ["swp1"]}),
    "DELETE /v1/fabric/leaves/{name}": platform("/v1/fabric/leaves/leaf1"),
    "POST /v1/fabric/spines": platform("/v1/fabric/spines", lambda o: {"name": "s9", "ports": ["swp1"]}),
    "DELETE /v1/fabric/spines/{name}": platform("/v1/fabric/spines/spine1"),
    "POST /v1/fabric/links": platform("/v1/fabric/links", lambda o: {"a": "leaf1:swp9", "b": "gpu1:p1"}),
    "POST /v1/fabric/links/remove": platform("/v1/fabric/links/remove", lambda o: {"a": "leaf1:swp1",
                                                                                    "b": "gpu1:p0"}),
    "PUT /v1/fabric/placements/{tenant}/{group}/{name}": on_b(f"/v1/fabric/placements/{B}/api/api-1", lambda o: {
        "node": "gpu1", "port": "pf0vf0", "ipv4": "10.2.0.9"}),
    "DELETE /v1/fabric/placements/{tenant}/{group}/{name}": on_b(f"/v1/fabric/placements/{B}/api/api-1"),
    "GET /v1/nodes/{name}/placements": platform("/v1/nodes/gpu1/placements"),
    "GET /v1/devices": platform("/v1/devices"),
    "GET /v1/devices/{device}": platform("/v1/devices/nic:gpu1"),
    "GET /v1/devices/{device}/ruleset": platform("/v1/devices/nic:gpu1/ruleset"),
    "GET /v1/devices/{device}/versions": platform("/v1/devices/nic:gpu1/versions"),
    "POST /v1/devices/{device}/status": platform("/v1/devices/nic:gpu1/status", lambda o: {}),
    "GET /v1/devices/{device}/fabric": platform("/v1/devices/leaf:leaf1/fabric"),
    # principals
    "GET /v1/whoami": Case("own_scope", "/v1/whoami"),
    "POST /v1/tokens": platform("/v1/tokens", lambda o: {"role": "tenant-admin", "tenant": B, "ttl_seconds": 60}),
    "GET /v1/tokens": platform("/v1/tokens"),
    "GET /v1/tokens/{token_id}": platform("/v1/tokens/{token}"),
    "POST /v1/tokens/{token_id}/revoke": platform("/v1/tokens/{token}/revoke", lambda o: REASON),
}


def operations(env: Env) -> set[str]:
    spec = env.app.openapi()
    return {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops
            if m in ("get", "post", "put", "patch", "delete")}


def snapshot(env: Env) -> dict[str, int]:
    """Row counts of every table plus the audit head: any write shows up here."""
    counts: dict[str, int] = {}
    with env.ctx.db.read_session() as s:
        for table in sorted(set(inspect(env.ctx.db.engine).get_table_names()) - SYSTEM_TABLES):
            counts[table] = int(s.connection().execute(text(f'SELECT count(*) FROM "{table}"')).scalar_one())
        rows = s.connection().execute(text("SELECT state, version FROM grants ORDER BY id")).all()
        counts["grant-states"] = hash(tuple(rows))
        q = s.connection().execute(text("SELECT count(*) FROM tenants WHERE quarantined")).scalar_one()
        counts["quarantined"] = int(q)
    return counts


@pytest.fixture
def objects(env_both: Env) -> dict[str, str]:
    """B's objects: a grant between globex and initech, an SVID of globex/api/api-1, a token of globex."""
    env = env_both
    with env.ctx.db.session() as s:
        create_tenant(s, slug="initech", display_name="Initech", actor=Actor.system("t"))
        create_group(s, tenant="initech", name="svc", ports=[{"proto": "tcp", "port": 443}],
                     actor=Actor.system("t"))
        issued = issue_x509_svid(s, env.ctx.keystore, csr_pem=csr_pem().encode(), tenant=B, group="api",
                                 workload="api-1", ttl=None, actor=Actor.system("t"), scope_tenant=None,
                                 clock=env.clock)
    r = env.call("POST", "/v1/grants", "tenant-admin", B, json={
        "src_group": "api", "dst_tenant": "initech", "dst_group": "svc", "proto": "tcp", "ports": [443],
        "ttl_seconds": 3600})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    tok = env.call("POST", "/v1/tokens", "admin", json={"role": "tenant-member", "tenant": B, "ttl_seconds": 600})
    assert tok.status_code == 201, tok.text
    with env.ctx.db.read_session() as s:
        b_event = s.connection().execute(
            text("SELECT max(seq) FROM audit_events WHERE tenant = :t"), {"t": B}).scalar_one()
    return {"grant": r.json()["id"], "serial": issued.serial, "token": tok.json()["info"]["id"], "csr": csr_pem(),
            "b_event": str(b_event)}


def test_every_operation_is_classified(env: Env) -> None:
    ops = operations(env)
    missing = sorted(ops - set(CASES))
    assert not missing, f"classify these operations in tests/api/test_isolation.py CASES: {missing}"
    stale = sorted(set(CASES) - ops)
    assert not stale, f"these classified operations no longer exist: {stale}"


@pytest.mark.parametrize("role", ["tenant-admin", "tenant-member"])
def test_tenant_a_cannot_reach_tenant_b(env_both: Env, objects: dict[str, str], role: str) -> None:
    """On both databases: every operation, both tenant roles."""
    env = env_both
    ops = operations(env)
    env.headers(role, A)  # mint A's token before taking the snapshot
    before = snapshot(env)
    failures: list[str] = []
    for op in sorted(ops):
        case = CASES.get(op)
        if case is None:
            failures.append(f"{op}: not classified")
            continue
        method, template = op.split(" ", 1)
        path = (case.path or template).format(**objects)
        body = case.body(objects) if case.body else None
        r = env.call(method, path, role, A, json=body)
        if r.status_code >= 500:
            failures.append(f"{op}: {r.status_code} {r.text[:200]}")
        elif case.kind in ("public", "global"):
            continue
        elif case.kind == "own_scope":
            if r.status_code == 200 and (B in r.text or "initech" in r.text):
                failures.append(f"{op}: leaks another tenant: {r.text[:300]}")
        elif case.kind == "on_b_entries" and r.status_code == 200:
            errors = [result.get("error") or {} for result in r.json()["results"]]
            if len(errors) != len((body or {}).get("svids", ())) or not all(
                    e.get("status") in case.expect and e.get("reason") for e in errors):
                failures.append(f"{op} as {role}@{A}: an entry not refused: {r.text[:300]}")
        elif r.status_code not in case.expect:
            failures.append(f"{op} as {role}@{A} on {path}: {r.status_code} {r.text[:200]}, want {set(case.expect)}")
        elif r.status_code in (403, 404) and not r.json().get("reason"):
            failures.append(f"{op}: denial without a reason")
    assert not failures, "\n".join(failures)
    assert snapshot(env) == before, "a request by tenant A changed something"


def test_tenant_b_itself_is_allowed_where_a_is_not(env_both: Env, objects: dict[str, str]) -> None:
    """The denials above are about scope, not broken routes: B's own admin gets through on B's objects."""
    env = env_both
    for path in (f"/v1/tenants/{B}", f"/v1/tenants/{B}/groups", f"/v1/tenants/{B}/groups/api",
                 f"/v1/tenants/{B}/workloads", f"/v1/grants/{objects['grant']}"):
        assert env.call("GET", path, "tenant-admin", B).status_code == 200, path
    r = env.call("POST", f"/v1/tenants/{B}/groups", "tenant-admin", B, json={"name": "new"})
    assert r.status_code == 201
    assert B in env.call("GET", "/v1/grants", "tenant-member", B).text
