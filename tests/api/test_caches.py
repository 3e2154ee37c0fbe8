"""The request-path caches listed in api/caches.py: each one's correctness argument holds, each can be
switched off (bench/api.py measures them that way) and the API answers the same with all of them off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from api.app import create_app
from api.caches import CACHES, cache_on
from core.vocabulary import ROLES
from policy.decide import authorize
from policy.engines.embedded import RegorusEngine
from policy.shipped import REGO_DIR, authz_modules
from tests.api.conftest import make_settings, open_env, seed

ACTIONS = ("tenant.read", "tenant.create", "grant.create", "grant.read", "audit.read", "svid.issue", "token.create")


def test_the_authz_answer_depends_only_on_the_cache_key() -> None:
    """The `authz` cache keys on (role, action, principal tenant, resource tenant): the shipped policy reads
    the principal's id only to check that there is one."""
    text = (REGO_DIR / "api_authz.rego").read_text()
    assert re.findall(r"[\w(]*input\.principal\.id\)?", text) == ["is_string(input.principal.id)"] * 2
    engine = RegorusEngine(authz_modules())
    try:
        for role in ROLES:
            for action in ACTIONS:
                for tenant, resource in ((None, None), ("acme", "acme"), ("acme", "globex")):
                    answers = {
                        authorize(engine, {"id": pid, "role": role, "tenant": tenant}, action,
                                  {"tenant": resource} if resource else {}).allow
                        for pid in ("alice", "spiffe://example.org/node/x", "oidc:bob")
                    }
                    assert len(answers) == 1, (role, action, tenant, resource)
    finally:
        engine.close()


def test_the_flow_set_depends_on_the_time_only_through_grant_expiry() -> None:
    """`flow_set` is kept until the earliest expiry of a grant in it: the shipped flows.rego defines its
    `now_ns` once and compares it with nothing but a grant's expiry, and reads no other clock."""
    code = "\n".join(line.split("#", 1)[0] for line in (REGO_DIR / "flows.rego").read_text().splitlines())
    uses = [line.strip() for line in code.splitlines() if re.search(r"(?<![.\w])now_ns\b", line)]
    # the whole set's comprehension binds it to a local once (`now := now_ns`, read outside its loops)
    assert uses == ["now_ns := input.now_ns if {", "now := now_ns", "g.expires_at_ns > now_ns"], uses
    alias = [line.strip() for line in code.splitlines() if re.search(r"(?<![.\w])now\b", line)]
    assert alias == ["now := now_ns", "g.expires_at_ns > now"], alias
    assert re.findall(r"\btime\.\w+", code) == ["time.now_ns"]


def test_caches_switch_off_by_name_and_a_typo_fails_at_start(tmp_path: Path) -> None:
    assert all(cache_on(frozenset(), name) for name in CACHES)
    assert not cache_on(frozenset({"all"}), "authz") and not cache_on(frozenset({"grant_data"}), "grant_data")
    with pytest.raises(ValueError, match="unknown cache"):
        cache_on(frozenset(), "grant_page")
    env = open_env(make_settings(tmp_path / "home"))
    try:
        bad = make_settings(tmp_path / "home", cache_off=frozenset({"grant_page"}))
        env.ctx.settings = bad
        with pytest.raises(ValueError, match="grant_page"):
            create_app(env.ctx)
    finally:
        env.client.close()
        env.ctx.close()


def test_the_api_answers_the_same_with_every_cache_off(tmp_path: Path) -> None:
    grant = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
             "ttl_seconds": 3600}
    pages, matrices = [], []
    for off in (frozenset(), frozenset({"all"})):
        env = open_env(make_settings(tmp_path / f"home-{len(off)}", cache_off=off))
        try:
            seed(env)
            app = env.app
            assert app.state.authorizer._use_cache == (not off)
            assert app.state.grant_decider._keep_data == (not off)
            assert (app.state.grant_pages.watch.version() is not None) == (not off)
            assert app.state.flow_sets._keep == (not off)
            for _ in range(2):  # the second answer would come from a cache
                r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json=grant)
                assert r.status_code == 201 and r.json()["state"] == "pending"
                r = env.call("GET", "/v1/grants", "tenant-admin", "acme")
                assert r.status_code == 200
                assert env.call("POST", "/v1/tenants", "tenant-admin", "acme",
                                json={"slug": "x", "display_name": "X"}).status_code == 403
            pages.append([(g["state"], g["src_tenant"], g["dst_group"]) for g in r.json()["items"]])
            evaluated = app.state.flow_sets.evaluations
            cells = [env.call("GET", "/v1/policy/flows/matrix", "security").json()["cells"] for _ in range(2)]
            assert cells[0] == cells[1] and cells[0]
            assert app.state.flow_sets.evaluations == evaluated + (2 if off else 1)
            matrices.append(cells[0])
        finally:
            env.client.close()
            env.ctx.close()
    assert pages[0] == pages[1] and len(pages[0]) == 2
    assert matrices[0] == matrices[1]
