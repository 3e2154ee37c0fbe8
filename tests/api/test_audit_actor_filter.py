"""GET /v1/audit/events?actor=: exactly that actor's events, with every other filter and the tenant scope
still applied (a tenant principal sees its own tenant's events of that actor only), on both databases."""

from __future__ import annotations

from tests.api.conftest import Env


def test_actor_filter_is_exact_and_keeps_the_tenant_scope(env_both: Env) -> None:
    env = env_both
    for tenant, group in (("acme", "a1"), ("globex", "g1")):
        assert env.call("POST", f"/v1/tenants/{tenant}/groups", "admin", json={"name": group}).status_code == 201
    everything = env.call("GET", "/v1/audit/events", "admin", params={"limit": 1000}).json()["items"]
    admin_id = next(e["actor"]["id"] for e in everything if e["object"]["id"] == "acme/a1")
    mine = [e["seq"] for e in everything if e["actor"]["id"] == admin_id]
    r = env.call("GET", "/v1/audit/events", "auditor", params={"actor": admin_id, "limit": 1000})
    assert r.status_code == 200 and [e["seq"] for e in r.json()["items"]] == mine
    assert {e["tenant"] for e in r.json()["items"]} >= {"acme", "globex"}
    r = env.call("GET", "/v1/audit/events", "tenant-admin", "acme", params={"actor": admin_id})
    assert r.status_code == 200 and {e["tenant"] for e in r.json()["items"]} == {"acme"}
    r = env.call("GET", "/v1/audit/events", "auditor", params={"actor": admin_id[:-1], "limit": 1000})
    assert r.json()["items"] == [], "exact, not a prefix"
    assert env.call("GET", "/v1/audit/events", "auditor", params={"actor": ""}).status_code == 422
