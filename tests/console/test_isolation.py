"""Tenant isolation in the console, enumerated from the console's own routes (api.console.console_routes):
every page and form is classified below and an unclassified one fails the test, so a new page cannot be
forgotten. Tenant A's session (acme; tenant-admin and tenant-member) addresses tenant B's (globex) pages
by URL and B's objects by form fields: it must be refused (403/404, with the API's reason), see nothing
of B, and write nothing anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.console import console_routes
from audit import Actor
from inventory.service import create_group, create_tenant
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.api.test_isolation import snapshot
from tests.console.conftest import csrf_of, sign_in

A, B = "acme", "globex"
B_SPIFFE = "spiffe://example.org/tenant/globex/group/api/api-1"
B_SECRET = "b-only-justification-7f3a"
REFUSED = frozenset({403, 404})


@dataclass(frozen=True)
class Case:
    kind: str  # public | global (no tenant data) | own | own_scope | on_b | last
    url: str = ""
    form: dict[str, str] | None = None


def on_b(url: str, **form: str) -> Case:
    return Case("on_b", url, form or None)


REASON = {"reason": "isolation test"}
CASES: dict[str, Case] = {
    "GET /console/login": Case("public"),
    "POST /console/login": Case("public"),
    "GET /console/oidc/start": Case("public"),
    "GET /console/oidc/callback": Case("public", "/console/oidc/callback?code=x&state=y"),
    "POST /console/logout": Case("last"),  # ends A's own session only: walked after every other case
    "GET /console/": Case("own"),
    "GET /console/tenants": Case("own_scope", "/console/tenants"),
    "GET /console/tenants/{tenant}": on_b(f"/console/tenants/{B}"),
    "POST /console/tenants/{tenant}/quarantine": on_b(f"/console/tenants/{B}/quarantine", **REASON),
    "POST /console/tenants/{tenant}/unquarantine": on_b(f"/console/tenants/{B}/unquarantine", **REASON),
    "POST /console/tenants/{tenant}/groups/{group}/quarantine": on_b(f"/console/tenants/{B}/groups/api/quarantine",
                                                                     **REASON),
    "POST /console/tenants/{tenant}/groups/{group}/unquarantine": on_b(
        f"/console/tenants/{B}/groups/api/unquarantine", **REASON),
    "POST /console/tenants/{tenant}/groups/{group}/workloads/{name}/revoke": on_b(
        f"/console/tenants/{B}/groups/api/workloads/api-1/revoke", **REASON),
    "GET /console/grants": Case("own_scope", f"/console/grants?src_tenant={B}&dst_tenant=initech"),
    "GET /console/grants/preview": on_b(
        f"/console/grants/preview?src_tenant={B}&src_group=api&dst_tenant=initech&dst_group=svc&ports=443"),
    "POST /console/grants": on_b("/console/grants", src_tenant=B, src_group="api", dst_tenant="initech",
                                 dst_group="svc", proto="tcp", ports="443", ttl_seconds="3600"),
    "GET /console/grants/{grant_id}": on_b("/console/grants/{grant}"),
    "POST /console/grants/{grant_id}/approve": on_b("/console/grants/{grant}/approve"),
    "POST /console/grants/{grant_id}/reject": on_b("/console/grants/{grant}/reject", **REASON),
    "POST /console/grants/{grant_id}/revoke": on_b("/console/grants/{grant}/revoke", **REASON),
    "GET /console/policy": on_b("/console/policy"),
    "POST /console/policy/upload": on_b("/console/policy/upload"),
    "GET /console/policy/versions/{ref}": on_b("/console/policy/versions/1"),
    "GET /console/policy/versions/{ref}/impact": on_b("/console/policy/versions/1/impact"),
    "GET /console/policy/versions/{ref}/activate": on_b("/console/policy/versions/1/activate"),
    "GET /console/policy/versions/{ref}/rollback": on_b("/console/policy/versions/1/rollback"),
    "POST /console/policy/versions/{ref}/activate": on_b("/console/policy/versions/1/activate", opened="0",
                                                         closed="0"),
    "POST /console/policy/versions/{ref}/rollback": on_b("/console/policy/versions/1/rollback", opened="0",
                                                         closed="0"),
    "GET /console/explain": on_b(f"/console/explain?src={B}/api&dst=initech/svc&port=443"),
    "GET /console/flows": on_b("/console/flows"),
    "GET /console/flows/{src}/{dst}": on_b(f"/console/flows/{B}/initech"),
    "GET /console/ca": on_b("/console/ca"),
    "GET /console/devices": on_b("/console/devices"),  # platform state: no tenant reads devices
    "GET /console/devices/{device}": on_b("/console/devices/nic:gpu1"),
    "GET /console/audit": on_b(f"/console/audit?tenant={B}"),
    "GET /console/audit/events/{seq}": on_b("/console/audit/events/{b_event}"),
    "GET /console/audit/export": Case("own_scope", "/console/audit/export"),  # the form alone, no data
    "POST /console/audit/export": on_b("/console/audit/export", format="jsonl", tenant=B),
    "GET /console/audit/public-key": Case("global", "/console/audit/public-key"),  # the audit public key
    "GET /console/decisions": on_b(f"/console/decisions?tenant={B}"),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, dict[str, str]]]:
    """B's objects: a grant between globex and initech (with a justification only B may read), B's events."""
    env = open_env(make_settings(Path(tmp_path_factory.mktemp("console-iso")) / "home"))
    seed(env)
    with env.ctx.db.session() as s:
        create_tenant(s, slug="initech", display_name="Initech", actor=Actor.system("t"))
        create_group(s, tenant="initech", name="svc", ports=[{"proto": "tcp", "port": 443}], actor=Actor.system("t"))
    r = env.call("POST", "/v1/grants", "tenant-admin", B, json={
        "src_group": "api", "dst_tenant": "initech", "dst_group": "svc", "proto": "tcp", "ports": [443],
        "ttl_seconds": 3600, "justification": B_SECRET})
    assert r.status_code == 201, r.text
    with env.ctx.db.read_session() as s:
        b_event = s.connection().execute(text("SELECT max(seq) FROM audit_events WHERE tenant = :t"),
                                         {"t": B}).scalar_one()
    yield env, {"grant": r.json()["id"], "b_event": str(b_event)}
    env.client.close()
    env.ctx.close()


def test_every_console_route_is_classified() -> None:
    routes = {f"{m} {p}" for m, p in console_routes()}
    missing = sorted(routes - set(CASES))
    assert not missing, f"classify these in tests/console/test_isolation.py CASES: {missing}"
    assert not sorted(set(CASES) - routes), f"no longer exist: {sorted(set(CASES) - routes)}"


def _request(client: TestClient, method: str, url: str, form: dict[str, str] | None, csrf: str) -> object:
    if method == "GET":
        return client.get(url)
    if url.endswith("/policy/upload"):
        return client.post(url, data={"csrf": csrf}, files=[("files", ("x/evil.rego", b"package evil\n"))])
    return client.post(url, data={**(form or {}), "csrf": csrf})


@pytest.mark.parametrize("role", ["tenant-admin", "tenant-member"])
def test_tenant_a_cannot_see_or_act_on_tenant_b(world: tuple[Env, dict[str, str]], role: str) -> None:
    env, objects = world
    client = sign_in(env, role, A)
    csrf = csrf_of(client, f"/console/tenants/{A}")
    before = snapshot(env)
    failures: list[str] = []
    for op, case in sorted(CASES.items()):
        if case.kind == "last":
            continue
        method, template = op.split(" ", 1)
        url = (case.url or template).format(**objects)
        r = _request(client, method, url, case.form, csrf)
        status, body = r.status_code, r.text  # type: ignore[attr-defined]
        if status >= 500:
            failures.append(f"{op}: {status} {body[:200]}")
        elif B_SPIFFE in body or B_SECRET in body:
            failures.append(f"{op}: shows tenant B's data")
        elif case.kind == "on_b":
            if status not in REFUSED:
                failures.append(f"{op} as {role}@{A} on {url}: {status}, want 403/404")
            elif "class=\"error\"" not in body and "refused" not in body:
                failures.append(f"{op}: refused without saying why")
        elif case.kind == "own":
            if status != 303 or r.headers["location"] != f"/console/tenants/{A}":  # type: ignore[attr-defined]
                failures.append(f"{op}: {status}, want the own tenant's page")
        elif case.kind == "own_scope":
            if status not in (200, 303) or objects["grant"] in body:
                failures.append(f"{op}: {status} or leaks another tenant")
        elif case.kind == "global" and status not in (200, 403):
            failures.append(f"{op}: {status}")
    assert not failures, "\n".join(failures)
    assert snapshot(env) == before, "a request by tenant A changed something"
    r = client.post("/console/logout", data={"csrf": csrf})  # the "last" case: A ends its own session
    assert r.status_code == 303 and client.get(f"/console/tenants/{A}").status_code == 303


def test_tenant_b_itself_gets_through_where_a_did_not(world: tuple[Env, dict[str, str]]) -> None:
    env, objects = world
    client = sign_in(env, "tenant-admin", B)
    r = client.get(f"/console/tenants/{B}")
    assert r.status_code == 200 and B_SPIFFE in r.text
    r = client.get(f"/console/grants/{objects['grant']}")
    assert r.status_code == 200 and B_SECRET in r.text
    assert client.get(f"/console/audit/events/{objects['b_event']}").status_code == 200
