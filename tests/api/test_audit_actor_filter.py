"""GET /v1/audit/events?actor=: exactly that actor's events, with every other filter and the tenant scope
still applied (a tenant principal sees its own tenant's events of that actor only), on both databases."""

from __future__ import annotations

from typing import Any

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


def test_the_same_subject_in_two_tenants_is_two_actors(env_both: Env) -> None:
    """API token subjects are free text: acme's and globex's tenant-admin `alice` are both id `alice`. Each makes a
    change, and globex's alice approves acme's alice's grant (an event filed under acme): the events name each
    actor's tenant, `?actor=alice@acme` is acme's alice only, `?actor=alice` every alice, `actor_tenant` the actors
    of a tenant; a tenant principal's filter stays inside its own tenant's events."""
    env = env_both

    def alice(tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {env.token('tenant-admin', tenant, subject='alice')}"}

    acme, globex = alice("acme"), alice("globex")
    assert env.client.post("/v1/tenants/acme/groups", json={"name": "a1"}, headers=acme).status_code == 201
    assert env.client.post("/v1/tenants/globex/groups", json={"name": "g1"}, headers=globex).status_code == 201
    grant = env.client.post("/v1/grants", headers=acme, json={
        "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
        "ttl_seconds": 3600, "justification": "call the globex API"})
    assert grant.status_code == 201, grant.text
    r = env.client.post(f"/v1/grants/{grant.json()['id']}/approve", headers=globex, json={})
    assert r.status_code == 200, r.text

    def found(role: str = "auditor", tenant: str | None = None, **params: str) -> list[tuple[str, Any, Any]]:
        r = env.call("GET", "/v1/audit/events", role, tenant, params={"limit": 1000, **params})
        assert r.status_code == 200, r.text
        return [(e["action"], e["tenant"], e["actor"].get("tenant")) for e in r.json()["items"]]

    everyone = [("group.create", "acme", "acme"), ("group.create", "globex", "globex"),
                ("grant.request", "acme", "acme"), ("grant.approve", "acme", "globex")]
    assert found(actor="alice") == everyone
    assert found(actor="alice@acme") == [("group.create", "acme", "acme"), ("grant.request", "acme", "acme")]
    assert found(actor="alice@globex") == [("group.create", "globex", "globex"), ("grant.approve", "acme", "globex")]
    assert found(actor="alice", actor_tenant="globex") == found(actor="alice@globex")
    assert found(actor_tenant="globex") == found(actor="alice@globex")  # globex's only actor here
    assert found(actor="alice@initech") == []
    # acme's own tenant-admin (another subject) sees globex's alice approving in acme's log, never globex's own
    assert found("tenant-admin", "acme", actor="alice@globex") == [("grant.approve", "acme", "globex")]
    assert found("tenant-admin", "acme", actor="alice") == [e for e in everyone if e[1] == "acme"]
    for bad in ({"actor_tenant": "Not_A_Slug"}, {"actor_tenant": ""}, {"actor": "a" * 577}):
        assert env.call("GET", "/v1/audit/events", "auditor", params=bad).status_code == 422, bad

    items = env.call("GET", "/v1/audit/events", "auditor", params={"limit": 1000}).json()["items"]
    approve = next(e for e in items if e["action"] == "grant.approve")
    assert approve["actor"] == {"id": "alice", "kind": "tenant", "tenant": "globex"}
    seeded = next(e for e in items if e["actor"]["kind"] == "system")
    assert "tenant" not in seeded["actor"], "an actor of no tenant has no key (the hashed object), not null"
    one = env.call("GET", f"/v1/audit/events/{approve['seq']}", "auditor").json()
    assert one["actor"] == approve["actor"]


def test_a_principal_is_an_actor_of_its_tenant() -> None:
    """Every Actor built from a principal: tenant roles and workloads (the tenant in the SPIFFE ID) name theirs;
    platform roles and nodes none."""
    from api.principal import Principal, principal_from_spiffe_id
    from audit import Actor

    workload = principal_from_spiffe_id("spiffe://td/tenant/acme/group/web/w1", "td", "mtls")
    assert workload.actor() == Actor("spiffe://td/tenant/acme/group/web/w1", "workload", "acme")
    assert principal_from_spiffe_id("spiffe://td/node/gpu1", "td", "mtls").actor() == Actor(
        "spiffe://td/node/gpu1", "node")
    assert Principal("alice", "tenant-member", "globex").actor() == Actor("alice", "tenant", "globex")
    assert Principal("alice", "admin", "acme").actor() == Actor("alice", "admin")  # a platform role: none


def test_an_export_takes_the_same_actor_filter_and_says_it_cannot_prove_it_complete(env_both: Env) -> None:
    """POST /v1/audit/exports takes actor and actor_tenant as GET /v1/audit/events does, and selects the same events.
    Nothing counts an actor's events, so the verifier proves each one authentic, in place and that actor's, and
    reports the selection unproven (never OK); a tenant export stays proven complete. An event of another actor
    slipped into it is caught."""
    import io
    import json

    import pytest

    from audit import checkpoint as cpm
    from audit.errors import OutsideFilter, Unproven
    from audit.verify import verify_export
    from audit.verify.report import VerifyReport

    env = env_both
    for tenant, sub in (("acme", "alice"), ("globex", "alice"), ("acme", "bob")):
        headers = {"Authorization": f"Bearer {env.token('tenant-admin', tenant, subject=sub)}"}
        r = env.client.post(f"/v1/tenants/{tenant}/groups", json={"name": f"{sub}-g"}, headers=headers)
        assert r.status_code == 201, r.text
    key = cpm.load_public_key(env.call("GET", "/v1/audit/checkpoint", "auditor").json()["public_key"])
    cases: list[dict[str, str]] = [{"actor": "alice@acme"}, {"actor": "alice"}, {"actor_tenant": "acme"},
                                   {"actor": "bob", "actor_tenant": "acme"}, {"actor": "alice", "tenant": "globex"}]
    for flt in cases:
        listed = env.call("GET", "/v1/audit/events", "auditor", params={"limit": 1000, **flt}).json()["items"]
        assert listed, flt
        for fmt in ("jsonl", "csv", "ocsf"):
            r = env.call("POST", "/v1/audit/exports", "auditor", json={"format": fmt, **flt})
            assert r.status_code == 200, (flt, r.text)
            with pytest.raises(Unproven) as unproven:
                verify_export(io.BytesIO(r.content), key)
            report = unproven.value.report
            assert isinstance(report, VerifyReport) and report.events == len(listed), (flt, fmt)
            assert {k: report.filter[k] for k in flt} == flt
            assert "the log keeps no count of an actor's events" in str(unproven.value)
        exported = [json.loads(line)["event"] for line in
                    env.call("POST", "/v1/audit/exports", "auditor", json=flt).content.splitlines()
                    if line.startswith(b'{"event":')]
        assert [e["seq"] for e in exported] == [e["seq"] for e in listed], flt
    # a tenant principal's export stays inside its tenant, its actor filter within it
    r = env.call("POST", "/v1/audit/exports", "tenant-admin", "acme", json={"actor": "alice"})
    with pytest.raises(Unproven) as mine:
        verify_export(io.BytesIO(r.content), key)
    assert isinstance(mine.value.report, VerifyReport) and mine.value.report.filter["tenant"] == "acme"
    # bob's event slipped into alice's export (its leaf hash left as it is) is outside the selection
    alice = env.call("POST", "/v1/audit/exports", "auditor", json={"actor": "alice@acme"}).content
    everything = env.call("POST", "/v1/audit/exports", "auditor", json={}).content.splitlines()
    bob = next(line for line in everything if b'"actor":{"id":"bob"' in line)
    lines = alice.splitlines()
    first_event = next(i for i, line in enumerate(lines) if line.startswith(b'{"event":'))
    forged = b"\n".join([*lines[:first_event], bob, *lines[first_event:]]) + b"\n"
    with pytest.raises(OutsideFilter, match="its actor 'bob@acme' is not one the export selects"):
        verify_export(io.BytesIO(forged), key)
    # the same bad values as the list refuses, and nothing is written for them
    for bad in ({"actor_tenant": "Not_A_Slug"}, {"actor_tenant": ""}, {"actor": "a" * 577}, {"actor": ""}):
        assert env.call("POST", "/v1/audit/exports", "auditor", json=bad).status_code == 422, bad
