"""GET /v1/policy/flows/matrix and /v1/policy/flows (the allowed set by tenant pair, with reasons) and
GET /v1/policy/explain-grant (a grant request's decision, nothing written): answers, scope, and the
kept flow set being reused only while it is provably current."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from tests.api.conftest import Env

REQUEST = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
           "ttl_seconds": 3600}


def _counts(env: Env) -> dict[tuple[str, str], int]:
    r = env.call("GET", "/v1/policy/flows/matrix", "security")
    assert r.status_code == 200, r.text
    return {(c["src_tenant"], c["dst_tenant"]): c["flows"] for c in r.json()["cells"]}


def _row_count(env: Env) -> int:
    with env.ctx.db.read_session() as s:
        return sum(int(s.connection().execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                   for t in ("grants", "audit_events", "policy_decisions"))


def test_matrix_and_cell_list_follow_grants(env_both: Env) -> None:
    env = env_both
    # acme: web<->db on 443 and 5432 (intra-tenant); globex: api, vault, public reach each other
    assert _counts(env) == {("acme", "acme"): 2, ("globex", "globex"): 8}
    grant = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=REQUEST).json()
    assert env.call("POST", f"/v1/grants/{grant['id']}/approve", "tenant-admin", "globex").status_code == 200
    assert _counts(env)[("acme", "globex")] == 1
    r = env.call("GET", "/v1/policy/flows?src_tenant=acme&dst_tenant=globex", "auditor")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 1 and body["items"] == [{
        "src_tenant": "acme", "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp",
        "port": 8443, "reasons": [f"grant:{grant['id']}"]}]
    page = env.call("GET", "/v1/policy/flows/matrix?limit=1", "admin").json()
    assert [t["tenant"] for t in page["tenants"]] == ["globex"] and page["next_offset"] == 1
    assert page["tenants"][0] == {"tenant": "globex", "flows": 9, "out_other": 0, "in_other": 1,
                                  "mirrors_out_other": 0, "mirrors_in_other": 0}
    assert env.call("GET", "/v1/policy/flows/matrix?search=acm", "admin").json()["tenants_matching"] == 1


def test_the_kept_set_is_reused_until_something_changes(env: Env) -> None:
    _counts(env)
    sets = env.app.state.flow_sets
    before = sets.evaluations
    _counts(env)
    assert sets.evaluations == before, "nothing changed: the kept set is current"
    env.call("GET", "/v1/policy/explain?src=acme/web&dst=acme/db&port=5432", "security")  # logs a decision
    _counts(env)
    assert sets.evaluations == before, "a commit outside the data document: the fingerprint is unchanged"
    grant = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQUEST, "dst_group": "public",
                                                                          "ports": [80]}).json()
    assert grant["state"] == "active"  # auto-approved: the data changed
    assert _counts(env)[("acme", "globex")] == 1 and sets.evaluations == before + 1
    env.clock.advance(timedelta(seconds=3601))  # the grant expires: the kept set is stale by time alone
    assert ("acme", "globex") not in _counts(env) and sets.evaluations == before + 2


def test_flow_reads_are_platform_only(env: Env) -> None:
    for path in ("/v1/policy/flows/matrix", "/v1/policy/flows?src_tenant=acme&dst_tenant=acme"):
        r = env.call("GET", path, "tenant-admin", "acme")
        assert r.status_code == 403 and "policy.read" in r.json()["reason"]


def test_explain_grant_answers_like_a_request_and_writes_nothing(env_both: Env) -> None:
    env = env_both
    for role, tenant in (("tenant-member", "acme"), ("tenant-admin", "acme"), ("security", None), ("admin", None)):
        env.headers(role, tenant)  # minting a token is audited: mint them before counting
    before = _row_count(env)
    q = "src_group=web&dst_tenant=globex&proto=tcp&ttl_seconds=3600"
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=8443", "tenant-member", "acme")
    assert r.status_code == 200, r.text
    # acme holds no grant with globex's groups: a request would be pending, approved at once or denied, and
    # with whom, depending on them; the answer is the same whichever (policy/disclosure.py), until acme asks
    hidden = r.json()
    assert (hidden["outcome"], hidden["approvers"]) == ("undisclosed", []) and len(hidden["reasons"]) == 1
    assert hidden["input"]["requester"] == {"tenant": "acme"}
    for group, port in (("vault", 8200), ("public", 80), ("nope", 443), ("api", 22)):  # sensitive, auto, none, shut
        r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group={group}&ports={port}", "tenant-admin", "acme")
        assert (r.json()["outcome"], r.json()["approvers"]) == ("undisclosed", []), (group, r.json())
        assert r.json()["reasons"] == [hidden["reasons"][0].replace("globex/api", f"globex/{group}")]
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=22&ports=0", "tenant-admin", "acme")
    reasons = r.json()["reasons"]  # acme holds no grant with globex/api: its inventory is not disclosed
    assert r.json()["outcome"] == "deny" and any(x.startswith("wildcard-ports") for x in reasons)
    assert any(x.startswith("undisclosed: ") for x in reasons) and not any("port-not-exposed" in x for x in reasons)
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=22&src_tenant=acme", "admin")
    assert any(x.startswith("port-not-exposed") for x in r.json()["reasons"])  # a platform principal sees all
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=8443&src_tenant=acme", "security")
    assert r.status_code == 403  # security may not request grants (grant.create)
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=8443&src_tenant=acme", "admin")
    assert r.json()["outcome"] == "pending"
    assert env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=8443", "admin").status_code == 400
    assert _row_count(env) == before
    # the request made (globex sees it): acme holds a grant with globex/api, and its answers are shown whole
    made = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={
        "src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "ttl_seconds": 3600})
    assert made.status_code == 201 and made.json()["state"] == "pending", made.text
    r = env.call("GET", f"/v1/policy/explain-grant?{q}&dst_group=api&ports=8443", "tenant-member", "acme")
    assert (r.json()["outcome"], r.json()["approvers"]) == ("pending", ["tenant-admin:globex"]), r.json()


def test_explain_grant_is_scoped_to_the_principals_tenant(env: Env) -> None:
    q = "src_tenant=globex&src_group=api&dst_tenant=acme&dst_group=web&proto=tcp&ports=443&ttl_seconds=60"
    r = env.call("GET", f"/v1/policy/explain-grant?{q}", "tenant-admin", "acme")
    assert r.status_code == 403 and "own groups" in r.json()["reason"]


def test_explain_answers_as_a_fresh_engine_would_and_reuses_the_kept_document(env: Env) -> None:
    """GET /v1/policy/explain decides on the grant decider's kept engine and document: the same decision
    and reasons as policy.service.explain's fresh engine, and no rebuild while nothing changed."""
    from policy import service

    grant = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=REQUEST).json()
    env.call("POST", f"/v1/grants/{grant['id']}/approve", "tenant-admin", "globex")
    flows = [("acme/web", "globex/api", 8443), ("acme/web", "globex/api", 443), ("acme/web", "acme/db", 5432),
             ("acme/db", "acme/db", 5432), ("globex/public", "acme/web", 443), ("acme/nope", "globex/api", 1)]
    decider = env.app.state.grant_decider
    env.call("GET", "/v1/policy/explain?src=acme/web&dst=acme/db&port=5432", "security")
    rebuilds = decider.rebuilds
    for src, dst, port in flows:
        r = env.call("GET", f"/v1/policy/explain?src={src}&dst={dst}&port={port}", "security")
        assert r.status_code == 200, r.text
        with env.ctx.db.read_session() as s:
            fresh, digest = service.explain(s, src, dst, port, now=env.clock())
        assert (r.json()["allow"], r.json()["reasons"], r.json()["policy_hash"]) == (
            fresh.allow, fresh.reasons, digest), (src, dst, port)
    assert decider.rebuilds == rebuilds, "nothing changed: the kept document was used"
    env.clock.advance(timedelta(seconds=3601))  # the grant expired: the same answer as a fresh engine
    r = env.call("GET", "/v1/policy/explain?src=acme/web&dst=globex/api&port=8443", "security").json()
    assert r["allow"] is False and r["reasons"][0].startswith("no-grant")


def test_after_grant_changes_alone_the_kept_set_is_patched_and_equals_a_fresh_one(env_both: Env) -> None:
    """On both databases: on PostgreSQL the key is the policy data version (step 9's counter), read in one
    REPEATABLE READ snapshot with the audit log's size and the events since."""
    env = env_both
    from audit import Actor
    from inventory.service import create_group
    from policy.flowset import FlowSets
    from policy.matrix import pair_counts

    sets = env.app.state.flow_sets

    def check(patched: bool) -> None:
        before = sets.patched
        kept = sets.current(env.clock())
        assert sets.patched == before + patched
        fresh = FlowSets(env.ctx.db, keep=False).current(env.clock())
        assert sorted(map(repr, kept.raw)) == sorted(map(repr, fresh.raw))
        assert kept.counts == fresh.counts == pair_counts(kept.raw)
        assert kept.data == fresh.data

    check(patched=False)
    grant = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=REQUEST).json()  # pending
    assert env.call("POST", f"/v1/grants/{grant['id']}/approve", "tenant-admin", "globex").status_code == 200
    auto = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={**REQUEST, "dst_group": "public",
                                                                         "ports": [80]}).json()
    check(patched=True)  # three grant events: one pending request (nothing to patch), an approval, an auto-approval
    assert env.call("POST", f"/v1/grants/{grant['id']}/revoke", "tenant-admin", "acme",
                    json={"reason": "done"}).status_code == 200
    check(patched=True)
    with env.ctx.db.session() as s:  # not a grant: the document is built again
        create_group(s, tenant="acme", name="cache", ports=[{"proto": "tcp", "port": 6379}],
                     actor=Actor.system("t"), clock=env.clock)
    check(patched=False)
    assert env.call("POST", f"/v1/grants/{auto['id']}/revoke", "tenant-admin", "acme",
                    json={"reason": "done"}).status_code == 200
    check(patched=True)
