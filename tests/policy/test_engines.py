"""Every engine kind behind the same protocol: load, compile errors, evaluate, patch, fail closed, parity."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from policy.decide import (
    FLOW_QUERY,
    GRANT_QUERY,
    allowed_flow_set,
    authorize,
    decide_flow,
    decide_grant_request,
    sync_data,
)
from policy.engines import PolicyEngine
from policy.engines.embedded import RegorusEngine
from policy.engines.opa_server import OpaServerEngine, OpaSettings
from policy.errors import EmptyQuery, PolicyCompileError, PolicyEngineError, QueryParseError
from tests.policy.conftest import LOADED
from tests.policy.helpers import NOW_NS, corpus, flow, reference_allowed, reference_allows, shipped, small_doc

Factory = Callable[[], PolicyEngine]


def test_flow_decisions_match_the_reference(make_engine: Factory) -> None:
    engine = make_engine()
    data = small_doc()
    engine.load(shipped(), data)
    inputs = [i for i in corpus(data) if "src" in i and isinstance(i["src"], dict)]
    answers = engine.evaluate_many(FLOW_QUERY, inputs)
    assert len(answers) == len(inputs) > 100
    for i, a in zip(inputs, answers, strict=True):
        assert a["allow"] is reference_allows(data, i), (i, a)
        assert a["reasons"], i
    assert set(allowed_flow_set(engine)) == reference_allowed(data)


def test_reasons_explain_each_outcome(make_engine: Factory) -> None:
    engine = make_engine()
    engine.load(shipped(), small_doc())
    cases = {
        ("acme", "web", "acme", "batch", "tcp", 8080): "intra-tenant:",
        ("acme", "web", "globex", "api", "tcp", 8443): "grant:g1",
        ("globex", "api", "platform", "dns", "udp", 53): "platform-service:",
        ("acme", "web", "acme", "batch", "tcp", 443): "port-not-exposed:",
        ("globex", "api", "acme", "db", "tcp", 5432): "no-grant:",  # g3 expired
        ("evil", "bot", "acme", "web", "tcp", 443): "quarantined:",  # g2 overridden
        ("ghost", "x", "acme", "web", "tcp", 443): "unknown-identity:",
    }
    for args, prefix in cases.items():
        d = decide_flow(engine, flow(*args))
        assert any(r.startswith(prefix) for r in d.reasons), (args, d)
        assert d.allow is prefix.startswith(("intra", "grant", "platform")), (args, d)
    revoked = flow("acme", "web", "acme", "batch", "tcp", 8080)
    revoked["src"]["spiffe_id"] = "spiffe://td/tenant/acme/group/web/bad"
    d = decide_flow(engine, revoked)
    assert not d.allow and d.reasons == ["revoked-identity: spiffe://td/tenant/acme/group/web/bad is revoked"]


def test_grant_and_authz_decisions(make_engine: Factory) -> None:
    engine = make_engine()
    data = small_doc()
    engine.load(shipped(), data)
    base = {"requester": {"tenant": "globex"}, "src": {"tenant": "globex", "group": "api"},
            "dst": {"tenant": "acme", "group": "db"}, "proto": "tcp", "ports": [5432], "ttl_seconds": 3600}
    d = decide_grant_request(engine, data, base)
    assert (d.outcome, d.approvers) == ("pending", ["security", "tenant-admin:acme"])
    d = decide_grant_request(engine, data, {**base, "ports": [22], "ttl_seconds": 8 * 86400})
    assert d.outcome == "deny"
    assert sorted(r.split(":")[0] for r in d.reasons) == ["port-not-exposed", "ttl-too-long"]
    ok = authorize(engine, {"id": "u", "role": "tenant-admin", "tenant": "acme"}, "grant.approve", {"tenant": "acme"})
    assert ok.allow
    no = authorize(engine, {"id": "u", "role": "tenant-admin", "tenant": "acme"}, "grant.approve", {"tenant": "globex"})
    assert not no.allow and any(r.startswith("out-of-scope:") for r in no.reasons)


def test_broken_module_rejected_with_location_and_previous_policy_stays(make_engine: Factory) -> None:
    engine = make_engine()
    engine.load(shipped(), small_doc())
    broken = dict(shipped())
    broken["flows.rego"] = broken["flows.rego"].replace("default decision :=", "default decision :=  {{", 1)
    with pytest.raises(PolicyCompileError) as info:
        engine.load(broken)
    issue = info.value.issues[0]
    assert issue.file.endswith("flows.rego") and issue.line > 1 and issue.col >= 1
    assert f"flows.rego:{issue.line}:{issue.col}" in str(info.value)
    assert decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080)).allow  # old policy still in force


def test_patch_data_is_applied_and_bad_patch_changes_nothing(make_engine: Factory) -> None:
    engine = make_engine()
    data = small_doc()
    engine.load(shipped(), data)
    f = flow("globex", "api", "acme", "web", "tcp", 443)
    assert not decide_flow(engine, f).allow
    new = small_doc()
    new["tf"]["grants"]["globex"] = {"acme": {"g9": {"src_group": "api", "dst_group": "web", "proto": "tcp",
                                                     "ports": [443], "expires_at_ns": NOW_NS + 10**12}}}
    sync_data(engine, new)
    d = decide_flow(engine, f)
    assert d.allow and d.reasons[0].startswith("grant:g9")
    with pytest.raises(Exception):
        engine.patch_data([{"op": "remove", "path": "/tf/grants/nobody"}])
    assert decide_flow(engine, f).allow
    sync_data(engine, small_doc())
    assert not decide_flow(engine, f).allow


def test_no_policy_denies_and_logs(make_engine: Factory, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine()
    engine.load({}, small_doc())
    with caplog.at_level(logging.WARNING, logger="policy.decide"):
        d = decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080))
    assert not d.allow and d.reasons[0].startswith("no-policy:")
    assert "no-policy" in caplog.text and "fail closed" in caplog.text


def test_engine_error_denies_and_logs(make_engine: Factory, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine()
    # compiles, but every evaluation of the decision fails at run time
    engine.load({"flows.rego": "package flows\n\ndecision := x if {\n\tx := 1 / input.zero\n}\n"}, small_doc())
    with caplog.at_level(logging.WARNING, logger="policy.decide"):
        d = decide_flow(engine, {**flow("acme", "web", "acme", "batch", "tcp", 8080), "zero": 0})
        g = decide_grant_request(engine, None, {"requester": {"tenant": "acme"}})
    assert not d.allow and d.reasons[0].startswith(("engine-error:", "no-policy:"))
    assert g.outcome == "deny"
    assert "fail closed" in caplog.text


def test_a_query_that_does_not_parse_is_told_from_one_that_fails_to_evaluate(make_engine: Factory) -> None:
    """An ad-hoc query with a syntax error is the caller's malformed request (QueryParseError, located in the
    query); a query that parses and fails while evaluating stays a PolicyEngineError. Both were
    PolicyEngineError, so the PDP answered a typo with 500 where OPA answers 400."""
    engine = make_engine()
    engine.load({"q.rego": "package q\n\nn := 2\n"}, small_doc())
    assert engine.query("x := data.q.n") == [{"x": 2}]
    for malformed in ("x := 1 +", "data.q.n[", "1 } p if { 2", "x := {", "", "# only a comment"):
        with pytest.raises(QueryParseError) as exc:
            engine.query(malformed)
        assert exc.value.issue.line == 1 and exc.value.issue.message, malformed
    for failing in ("x := 1 / 0", "x := count(data.q.n)"):
        with pytest.raises(PolicyEngineError):
            engine.query(failing)


def test_an_empty_query_says_so_on_every_engine(make_engine: Factory) -> None:
    """A query of blanks and comments was the parser's bare "expecting ..." at 1:1 (and, from an OPA server, which
    refuses it as a compile error, a PolicyEngineError): every engine now says the query is empty and what one
    looks like, before asking anything of the engine; still a QueryParseError, as before."""
    engine = make_engine()
    for empty in ("", "   ", "\n# only a comment\n\t\n"):
        with pytest.raises(EmptyQuery, match=r"^the query is empty: give a Rego query, e\.g\. data\.flows\.decision"):
            engine.query(empty)
    assert engine.query("x := 1  # a comment after an expression") == [{"x": 1}]


def test_malformed_answer_denies(make_engine: Factory) -> None:
    engine = make_engine()
    engine.load({"flows.rego": 'package flows\n\ndecision := {"allow": "yes", "reasons": []}\n'}, small_doc())
    d = decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080))
    assert not d.allow and d.reasons[0].startswith("engine-error: malformed")


def test_unreachable_server_fails_closed(caplog: pytest.LogCaptureFixture) -> None:
    from tests.policy.conftest import free_port

    engine = OpaServerEngine(OpaSettings(url=f"http://127.0.0.1:{free_port()}", timeout=0.5))
    engine._modules = shipped()  # as if loaded before the server went away
    with pytest.raises(PolicyEngineError):
        engine.evaluate(FLOW_QUERY, flow("acme", "web", "acme", "batch", "tcp", 8080))
    with caplog.at_level(logging.WARNING, logger="policy.decide"):
        d = decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080))
    assert not d.allow and d.reasons[0].startswith("engine-error:")
    assert "fail closed" in caplog.text


def test_wrong_bearer_token_fails_closed(pdp: object) -> None:
    url = pdp.url  # type: ignore[attr-defined]
    bad = OpaServerEngine(OpaSettings(url=url, token="wrong", timeout=2.0))
    with pytest.raises(PolicyEngineError):
        bad.load(shipped(), small_doc())
    assert not decide_flow(bad, flow("acme", "web", "acme", "batch", "tcp", 8080)).allow
    bad.close()


def test_embedded_and_server_engines_agree_on_a_generated_corpus(pdp: object, opa_url: str | None) -> None:
    data = small_doc()
    embedded = RegorusEngine(shipped(), data)
    servers: list[PolicyEngine] = [OpaServerEngine(OpaSettings(url=pdp.url, token=pdp.token, timeout=LOADED))]  # type: ignore[attr-defined]
    if opa_url:
        servers.append(OpaServerEngine(OpaSettings(url=opa_url, timeout=LOADED)))
    flows_in = corpus(data)
    grants_in = [
        {"requester": {"tenant": st}, "src": {"tenant": st, "group": sg}, "dst": {"tenant": dt, "group": dg},
         "proto": proto, "ports": ports, "ttl_seconds": ttl}
        for st, sg, dt, dg in [("acme", "web", "globex", "api"), ("globex", "api", "acme", "db"),
                               ("evil", "bot", "acme", "web"), ("acme", "web", "platform", "dns")]
        for proto in ("tcp", "udp")
        for ports in ([8443], [5432], [22], "*", [])
        for ttl in (60, 700000)
    ]
    authz_in = [
        {"principal": {"id": "p", "role": role, "tenant": pt}, "action": action, "resource": {"tenant": rt}}
        for role in ("admin", "security", "tenant-admin", "tenant-member", "auditor", "node", "root")
        for pt in ("acme", None)
        for rt in ("acme", "globex")
        for action in ("grant.create", "grant.approve", "svid.issue", "audit.read", "policy.activate",
                       "tenant.quarantine")
    ]
    expected = {q: embedded.evaluate_many(q, batch) for q, batch in
                [(FLOW_QUERY, flows_in), (GRANT_QUERY, grants_in), ("data.api_authz.decision", authz_in)]}
    for server in servers:
        server.load(shipped(), data)
        for q, batch in [(FLOW_QUERY, flows_in), (GRANT_QUERY, grants_in), ("data.api_authz.decision", authz_in)]:
            assert server.evaluate_many(q, batch) == expected[q], q
        server.close()


def test_unknown_identity_is_denied_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    engine = RegorusEngine(shipped(), small_doc())
    with caplog.at_level(logging.INFO, logger="policy.decide"):
        d = decide_flow(engine, flow("ghost", "x", "acme", "web", "tcp", 443))
    assert not d.allow and d.reasons == ["unknown-identity: ghost/x is not in the inventory"]
    assert "flow denied: unknown-identity: ghost/x" in caplog.text


def test_a_load_that_fails_part_way_changes_nothing(make_engine: Factory) -> None:
    """A version whose flows.rego changes and whose grants.rego is broken: rejected with file:line:col, and
    the engine (for a server: every module on it) still answers with the previous policy."""
    engine = make_engine()
    engine.load(shipped(), small_doc())
    platform = flow("globex", "api", "platform", "dns", "udp", 53)
    assert decide_flow(engine, platform).allow
    candidate = dict(shipped())
    candidate["flows.rego"] = candidate["flows.rego"].replace(
        'platform_tenant := "platform"', 'platform_tenant := "nowhere"', 1)
    candidate["grants.rego"] = candidate["grants.rego"].replace("max_ttl_seconds := 604800", "max_ttl_seconds := ", 1)
    candidate["extra.rego"] = "package extra\n\nx := 1\n"
    with pytest.raises(PolicyCompileError) as info:
        engine.load(candidate)
    assert info.value.issues[0].file == "grants.rego"
    assert engine.modules() == shipped()
    assert decide_flow(engine, platform).allow  # the new flows.rego never went live
    assert engine.evaluate("data.extra.x") is None
