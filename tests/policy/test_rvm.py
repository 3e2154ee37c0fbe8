"""regorus's compiled VM as the embedded engine's accelerator (policy/engines/rvm.py): the same answers as the
interpreter on the shipped policies (tables, and hypothesis over malformed inputs), every fallback counted,
TRUSTFABRIC_REGO_VM=off really off, data changes seen at once, uploaded versions the VM refuses or that are not
vetted answered by the interpreter."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from policy.decide import AUTHZ_QUERY, FLOW_QUERY, GRANT_QUERY, authorize, decide_grant_request
from policy.engines import EngineSettings, make_engine
from policy.engines.embedded import RegorusEngine
from policy.engines.rvm import HOT_ENTRY_POINTS, Accelerator, compile_program, packages_of, shipped_modules
from policy.errors import PolicyEngineError
from tests.policy.helpers import corpus, doc, flow, group, small_doc
from workflows.settings import Settings


def modules() -> dict[str, str]:
    return shipped_modules()


def pair(data: dict[str, Any] | None = None, mods: dict[str, str] | None = None,
         **kw: Any) -> tuple[RegorusEngine, RegorusEngine, Accelerator]:
    """(engine with the VM, interpreter only, the accelerator), same modules and data."""
    data = small_doc() if data is None else data
    mods = modules() if mods is None else mods
    acc = Accelerator(amortize=kw.pop("amortize", False), **kw)
    return RegorusEngine(mods, data, accelerator=acc), RegorusEngine(mods, data), acc


def outcome(engine: RegorusEngine, query: str, input: Any) -> Any:
    """The answer, or the failure (the interpreter's errors must stay errors)."""
    try:
        return ("value", engine.evaluate(query, input))
    except PolicyEngineError:
        return ("error", None)


def agree(query: str, inputs: list[Any], data: dict[str, Any] | None = None) -> tuple[int, dict[str, int]]:
    """Asserts the VM engine answers each input as the interpreter does; (answers the VM gave, stats)."""
    fast, ref, acc = pair(data)
    for i in inputs:
        before = acc.stats()["vm_answers"]
        got, want = outcome(fast, query, i), outcome(ref, query, i)
        assert got == want, (query, i, got, want)
        if acc.stats()["vm_answers"] == before:
            assert want[0] == "error" or acc.stats()["undefined_values"], (query, i, acc.stats())
    stats = acc.stats()
    return stats["vm_answers"], stats


# ---------------------------------------------------------------- tables on the shipped policies


def test_the_shipped_policies_compile_for_every_hot_entry_point() -> None:
    compiled = compile_program(modules())
    assert compiled.binary and compiled.entry_points == frozenset(HOT_ENTRY_POINTS) and not compiled.refused


def test_flow_decisions_agree_on_the_whole_corpus() -> None:
    data = small_doc()
    cases = corpus(data)
    cases += [
        flow("acme", "web", "globex", "api", "tcp", 8443, now_ns=10**30),  # the grant expired by then
        flow("acme", "web", "acme", "db", "tcp", 5432, **{"src": {"tenant": "acme", "group": "web",
                                                                 "spiffe_id": "spiffe://td/tenant/acme/group/web/bad"}}),
        flow("acme", "web", "acme", "db", "tcp", 5432, **{"src": {"tenant": "acme", "group": "web",
                                                                 "spiffe_id": "spiffe://td/tenant/globex/group/api/x"}}),
        {}, {"src": {}, "dst": {}}, {"src": "acme/web", "dst": "globex/api", "proto": "tcp", "port": 8443},
    ]
    answered, stats = agree(FLOW_QUERY, cases, data)
    assert answered >= len(cases) - 5 and stats["vm_errors"] == 0, stats


GRANT_TABLE: list[dict[str, Any]] = []


def _grant(dt: str, dg: str, ports: Any, ttl: Any = 3600, **over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"requester": {"tenant": "acme"}, "src": {"tenant": "acme", "group": "web"},
                           "dst": {"tenant": dt, "group": dg}, "proto": "tcp", "ports": ports, "ttl_seconds": ttl}
    out.update(over)
    return out


GRANT_TABLE += [
    _grant("globex", "api", [8443]),  # pending, tenant admin
    _grant("acme", "db", [5432]),  # same tenant
    _grant("globex", "api", [8443, 9443]),
    _grant("globex", "api", [22]),  # not exposed
    _grant("globex", "api", []), _grant("globex", "api", "*"), _grant("globex", "api", 8443),
    _grant("globex", "api", [0]), _grant("globex", "api", [70000]), _grant("globex", "api", [8443.5]),
    _grant("globex", "api", [8443], ttl=0), _grant("globex", "api", [8443], ttl=10**9),
    _grant("globex", "api", [8443], ttl="1h"),
    _grant("globex", "nope", [8443]), _grant("evil", "bot", [80]), _grant("platform", "dns", [53], proto="udp"),
    _grant("globex", "api", [8443], proto="icmp"), _grant("globex", "api", [8443], requester={"tenant": "globex"}),
    _grant("auto", "open", [80]), _grant("auto", "secret", [80]),
    {}, {"requester": {}, "src": {}, "dst": {}}, {"src": "acme/web"},
]


def _grant_doc() -> dict[str, Any]:
    data = small_doc()
    data["tf"]["tenants"]["auto"] = {"quarantined": False, "groups": {
        "open": group([("tcp", 80)], labels={"grants.trustfabric.io/auto-approve": "true"}),
        "secret": group([("tcp", 80)], sensitivity="sensitive", labels={"grants.trustfabric.io/auto-approve": "true"}),
    }}
    return data


def test_grant_decisions_agree_on_the_table() -> None:
    answered, stats = agree(GRANT_QUERY, GRANT_TABLE, _grant_doc())
    # the three requests without their fields: the VM leaves undefined elements in the reasons (sprintf over a
    # missing field), so the interpreter answers those
    assert answered == len(GRANT_TABLE) - 3 and stats["undefined_values"] == 3 and stats["vm_errors"] == 0, stats
    fast, _, _ = pair(_grant_doc())
    assert decide_grant_request(fast, None, _grant("auto", "open", [80])).outcome == "approve"
    assert decide_grant_request(fast, None, _grant("globex", "api", [8443])).approvers == ["tenant-admin:globex"]
    assert decide_grant_request(fast, None, _grant("globex", "api", 8443)).outcome == "deny"


ROLES = ["admin", "security", "tenant-admin", "tenant-member", "auditor", "node", "nobody", None, 7]
ACTIONS = ["grant.create", "grant.approve", "policy.activate", "audit.export", "svid.issue", "x.y", None]


def test_authorization_decisions_agree_on_every_role_action_and_scope() -> None:
    cases: list[dict[str, Any]] = [
        {"principal": {"id": pid, "role": role, "tenant": pt}, "action": action, "resource": {"tenant": rt}}
        for role in ROLES for action in ACTIONS for pid in ("p1", None) for pt in ("acme", None, "")
        for rt in ("acme", "globex", None)
    ]
    cases += [{}, {"principal": "admin"}, {"principal": {"id": "p", "role": "admin"}, "action": "x"}]
    answered, stats = agree(AUTHZ_QUERY, cases)
    # {} and {"principal": "admin"}: undefined elements in the VM's reasons, answered by the interpreter
    assert answered == len(cases) - 2 and stats["undefined_values"] == 2 and stats["vm_errors"] == 0, stats
    fast, _, _ = pair()
    admin = {"id": "p", "role": "tenant-admin", "tenant": "acme"}
    assert authorize(fast, admin, "grant.create", {"tenant": "acme"}).allow
    assert not authorize(fast, {"id": "p", "role": "tenant-admin", "tenant": "acme"}, "grant.create",
                         {"tenant": "globex"}).allow


# ---------------------------------------------------------------- malformed inputs (hypothesis)

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53),
                      st.floats(allow_nan=False, allow_infinity=False, width=64),
                      st.sampled_from(["", "acme", "web", "globex", "api", "platform", "dns", "tcp", "udp", "db",
                                       "evil", "bot", "%s", "%v/%d", "<undefined>", "spiffe://td/tenant/acme/group/web/bad",
                                       "admin", "tenant-admin", "grant.create"]),
                      st.text(max_size=6))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                    max_leaves=6)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field that is absent (None here, dropped below), well-typed, or any JSON value."""
    return st.one_of(st.just(None), strategy, JSON)


def side() -> st.SearchStrategy[Any]:
    good = st.fixed_dictionaries({"tenant": st.sampled_from(["acme", "globex", "platform", "evil", "nope"]),
                                  "group": st.sampled_from(["web", "db", "api", "dns", "bot", "batch", "x"])},
                                 optional={"spiffe_id": st.sampled_from(
                                     ["spiffe://td/tenant/acme/group/web/bad", "spiffe://td/tenant/acme/group/web/w",
                                      "spiffe://td/tenant/globex/group/api/w", "x"])})
    return maybe(good)


def drop_absent(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


FLOW_INPUTS = st.builds(lambda s, d, proto, port, now: drop_absent(
    {"src": s, "dst": d, "proto": proto, "port": port, "now_ns": now}),
    side(), side(), maybe(st.sampled_from(["tcp", "udp", "icmp"])),
    maybe(st.sampled_from([443, 5432, 8443, 53, 9000, 0, 8443.0, 65536])), maybe(st.integers(0, 2**62)))
GRANT_INPUTS = st.builds(lambda r, s, d, proto, ports, ttl: drop_absent(
    {"requester": r, "src": s, "dst": d, "proto": proto, "ports": ports, "ttl_seconds": ttl}),
    maybe(st.fixed_dictionaries({"tenant": st.sampled_from(["acme", "globex", "evil"])})), side(), side(),
    maybe(st.sampled_from(["tcp", "udp"])),
    maybe(st.lists(st.sampled_from([80, 443, 8443, 0, 1.5, "x", 5432]), max_size=3)),
    maybe(st.sampled_from([1, 3600, 604800, 604801, 0, -1, 1.5])))
AUTHZ_INPUTS = st.builds(lambda p, a, r: drop_absent({"principal": p, "action": a, "resource": r}),
                         maybe(st.fixed_dictionaries({}, optional={
                             "id": maybe(st.just("p1")), "role": maybe(st.sampled_from(ROLES[:6])),
                             "tenant": maybe(st.sampled_from(["acme", "globex", ""]))})),
                         maybe(st.sampled_from(ACTIONS[:6])),
                         maybe(st.fixed_dictionaries({}, optional={
                             "tenant": maybe(st.sampled_from(["acme", "globex"]))})))

_ENGINES: dict[str, tuple[RegorusEngine, RegorusEngine, Accelerator]] = {}


def _shared_pair() -> tuple[RegorusEngine, RegorusEngine, Accelerator]:
    """One pair per thread for the property tests (building one per example would dominate their time)."""
    key = f"pair-{threading.get_ident()}"
    if key not in _ENGINES:
        _ENGINES[key] = pair(_grant_doc())
    return _ENGINES[key]


@pytest.mark.parametrize(("query", "inputs"), [(FLOW_QUERY, FLOW_INPUTS), (GRANT_QUERY, GRANT_INPUTS),
                                               (AUTHZ_QUERY, AUTHZ_INPUTS)], ids=["flows", "grants", "authz"])
def test_malformed_inputs_get_the_interpreters_answer(query: str, inputs: st.SearchStrategy[Any]) -> None:
    fast, ref, acc = _shared_pair()
    before = acc.stats()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(inputs)
    def check(i: Any) -> None:
        assert outcome(fast, query, i) == outcome(ref, query, i), i

    check()
    after = acc.stats()
    # the VM really answered a good share (the rest: undefined elements from missing fields, interpreter answers)
    assert after["vm_answers"] - before["vm_answers"] >= 30, after
    assert after["vm_errors"] == before["vm_errors"], after


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_json_input_gets_the_interpreters_answer(value: Any) -> None:
    fast, ref, _ = _shared_pair()
    for query in HOT_ENTRY_POINTS:
        assert outcome(fast, query, value) == outcome(ref, query, value), (query, value)
        assert outcome(fast, query, {"src": value, "dst": value, "principal": value, "ports": value}) == outcome(
            ref, query, {"src": value, "dst": value, "principal": value, "ports": value})


# ---------------------------------------------------------------- fallbacks, counted

UNDEFINED_INSIDE = '''package flows
# a set element built with sprintf over a missing input field: the VM keeps an undefined element
why contains sprintf("port %v", [input.port])
why contains "checked"
decision := {"allow": false, "reasons": sort(why)}
'''


def test_an_undefined_value_inside_the_vms_answer_is_answered_by_the_interpreter() -> None:
    mods = {"flows.rego": UNDEFINED_INSIDE}
    fast, ref, acc = pair(mods=mods, vetted=mods)
    assert fast.evaluate(FLOW_QUERY, {}) == ref.evaluate(FLOW_QUERY, {}) == {"allow": False, "reasons": ["checked"]}
    assert acc.stats()["undefined_values"] == 1 and acc.stats()["vm_answers"] == 0
    assert fast.evaluate(FLOW_QUERY, {"port": 1}) == {"allow": False, "reasons": ["checked", "port 1"]}
    assert acc.stats()["vm_answers"] == 1


ERRORS_BECOME_DEFAULT = '''package flows
default decision := {"allow": true, "reasons": ["default"]}
decision := {"allow": false, "reasons": ["counted"]} if count(input.port) > 0
'''


def test_an_unvetted_version_is_answered_by_the_interpreter_even_where_the_vm_would_answer() -> None:
    """Why vetting exists: where the interpreter fails (count of a number), the VM answers the default."""
    mods = {"flows.rego": ERRORS_BECOME_DEFAULT}
    trusting, _, trusted = pair(mods=mods, vetted=mods)
    assert trusting.evaluate(FLOW_QUERY, {"port": 5}) == {"allow": True, "reasons": ["default"]}  # the VM's answer
    assert trusted.stats()["vm_answers"] == 1
    fast, ref, acc = pair(mods=mods)  # vetted: the shipped modules only
    with pytest.raises(PolicyEngineError):
        ref.evaluate(FLOW_QUERY, {"port": 5})
    with pytest.raises(PolicyEngineError):
        fast.evaluate(FLOW_QUERY, {"port": 5})
    assert acc.stats()["not_compiled"] == 1 and acc.stats()["vm_answers"] == 0


# A module of package tf (what the vetted modules read) disguised from a reading of the text: its `package` line
# indented or ended by CRLF, a `package decoy` line inside a raw string. now_ns there is a division by zero: the
# interpreter fails every flow decision that reads it, the VM would take its undefined for the default (found in
# review: a grant's flow allowed by the VM where the interpreter failed closed).
DISGUISED = {
    "indented": "  package tf\n\nnow_ns := x if { x := input.port / 0 }\n\ns := `\npackage decoy\n`\n",
    "crlf": "package tf\r\n\r\nnow_ns := x if { x := input.port / 0 }\r\n",
    "plain": "package tf\n\nnow_ns := x if { x := input.port / 0 }\n",
}


@pytest.mark.parametrize("how", sorted(DISGUISED))
def test_a_module_shadowing_what_the_vetted_ones_read_is_found_however_its_package_is_written(how: str) -> None:
    data = small_doc()
    data["tf"].pop("now_ns", None)  # as in production: no pinned now, so flows.now_ns reads data.tf.now_ns
    mods = {**modules(), "evil.rego": DISGUISED[how]}
    assert packages_of({"evil.rego": DISGUISED[how]}) == {"evil.rego": ("tf",)}
    fast, ref, acc = pair(data, mods)
    for i in corpus(data)[:40]:
        assert outcome(fast, FLOW_QUERY, i) == outcome(ref, FLOW_QUERY, i), i
    assert acc.stats()["vm_answers"] == 0 and acc.stats()["not_compiled"] == 40


class _BrokenData(RegorusEngine):
    """An engine whose data text the VM cannot load (what a document regorus's VM refuses would do); counts how
    often the accelerator asked for it."""

    snapshots = 0

    def snapshot(self, text: bool) -> tuple[int, Mapping[str, str], int, str]:
        gens, mods, data_gen, body = super().snapshot(text)
        if text:
            type(self).snapshots += 1
            body = "{not json"
        return gens, mods, data_gen, body


def test_a_failed_vm_load_is_not_tried_again_until_the_data_changes() -> None:
    """Each try parses the whole document (25-35 ms at 1,000 tenants): a load that failed is tried again only once
    the generations move, and the interpreter answers meanwhile."""
    acc = Accelerator(amortize=False)
    engine = _BrokenData(modules(), small_doc(), accelerator=acc)
    ref = RegorusEngine(modules(), small_doc())
    request = flow("acme", "web", "globex", "api", "tcp", 8443)
    for _ in range(5):
        assert engine.evaluate(FLOW_QUERY, request) == ref.evaluate(FLOW_QUERY, request)
    assert _BrokenData.snapshots == 1 and acc.stats()["vm_errors"] == 5 and acc.stats()["vm_answers"] == 0
    engine.patch_data([{"op": "add", "path": "/tf/revoked/spiffe:~1~1example.org~1x", "value": True}])
    engine.evaluate(FLOW_QUERY, request)
    assert _BrokenData.snapshots == 2  # a new generation: tried once more


def test_an_uploaded_version_the_vm_refuses_is_answered_by_the_interpreter() -> None:
    """The grants.rego before this change read the data root (object.get(data, ...)), which the VM refuses."""
    old = modules()
    old["grants.rego"] = old["grants.rego"].replace(
        "default tenants := {}\n\ntenants := data.tf.tenants", 'tenants := object.get(data, ["tf", "tenants"], {})')
    assert "object.get(data" in old["grants.rego"]
    compiled = compile_program(old)
    assert "data.grants.decision" in compiled.refused and "data.flows.decision" in compiled.entry_points
    fast, ref, acc = pair(_grant_doc(), old, vetted=old)
    for request in GRANT_TABLE:
        assert outcome(fast, GRANT_QUERY, request) == outcome(ref, GRANT_QUERY, request)
    assert acc.stats()["not_compiled"] == len(GRANT_TABLE) and acc.stats()["vm_errors"] == 0
    assert fast.evaluate(FLOW_QUERY, flow("acme", "web", "globex", "api", "tcp", 8443))["allow"] is True
    assert acc.stats()["vm_answers"] == 1  # the other entry points still go through the VM


def test_a_version_changing_one_package_keeps_the_vm_for_the_others() -> None:
    mods = modules()
    mods["flows.rego"] = mods["flows.rego"].replace('platform_tenant := "platform"', 'platform_tenant := "infra"')
    fast, ref, acc = pair(mods=mods)
    f = flow("acme", "web", "platform", "dns", "udp", 53)
    assert fast.evaluate(FLOW_QUERY, f) == ref.evaluate(FLOW_QUERY, f) and not ref.evaluate(FLOW_QUERY, f)["allow"]
    assert acc.stats()["not_compiled"] == 1
    assert fast.evaluate(GRANT_QUERY, _grant("globex", "api", [8443]))["outcome"] == "pending"
    assert acc.stats()["vm_answers"] == 1
    shadow = modules()
    shadow["shadow.rego"] = "package tf\n\ntenants := {}\n"  # a rule where the data was: nothing vetted applies
    fast, ref, acc = pair(mods=shadow)
    assert fast.evaluate(GRANT_QUERY, _grant("globex", "api", [8443])) == ref.evaluate(
        GRANT_QUERY, _grant("globex", "api", [8443]))
    assert acc.stats()["vm_answers"] == 0 and acc.stats()["not_compiled"] == 1


LONG_LOOP = '''package flows
decision := {"allow": false, "reasons": [sprintf("%d items", [count([x | some x in input.items; x >= 0])])]}
'''


def test_a_vm_error_is_answered_by_the_interpreter() -> None:
    """regorus's VM stops a program after 25,000 instructions (an error), where the interpreter runs on."""
    mods = {"flows.rego": LONG_LOOP}
    fast, ref, acc = pair(mods=mods, vetted=mods)
    assert fast.evaluate(FLOW_QUERY, {"items": [1, 2]}) == {"allow": False, "reasons": ["2 items"]}
    assert acc.stats()["vm_answers"] == 1
    big = {"items": list(range(20_000))}
    want = {"allow": False, "reasons": ["20000 items"]}
    assert fast.evaluate(FLOW_QUERY, big) == ref.evaluate(FLOW_QUERY, big) == want
    assert acc.stats()["vm_errors"] == 1 and acc.stats()["vm_answers"] == 1


# ---------------------------------------------------------------- data changes, threads, the switch


def test_a_grant_approved_or_revoked_is_seen_at_once() -> None:
    data = small_doc()
    f = flow("globex", "api", "acme", "web", "tcp", 443)
    for amortize in (False, True):
        fast, _, acc = pair(data, amortize=amortize)
        assert fast.evaluate(FLOW_QUERY, f)["allow"] is False
        fast.patch_data([{"op": "add", "path": "/tf/grants/globex", "value": {"acme": {"g9": {
            "src_group": "api", "dst_group": "web", "proto": "tcp", "ports": [443], "expires_at_ns": 2 * 10**18}}}}])
        assert fast.evaluate(FLOW_QUERY, f) == {"allow": True, "reasons": [
            "grant:g9 allows globex/api -> acme/web on tcp/443"]}
        fast.patch_data([{"op": "remove", "path": "/tf/grants/globex/acme/g9"}])
        assert fast.evaluate(FLOW_QUERY, f)["allow"] is False
        stats = acc.stats()
        if amortize:  # the first decision after a change: the interpreter (at this size a reload is soon paid for)
            assert stats["stale_data"] >= 1 and stats["vm_answers"] + stats["stale_data"] == 3, stats
        else:
            assert stats["vm_answers"] == 3 and stats["data_loads"] == 3, stats  # the VM, reloaded each time
    # amortized: the VM reloads once the interpreter has cost what a reload costs, and then answers the new data
    fast, _, acc = pair(data, amortize=True)
    fast.evaluate(FLOW_QUERY, f)
    fast.patch_data([{"op": "add", "path": "/tf/revoked/spiffe:~1~1td~1tenant~1globex~1group~1api~1w", "value": True}])
    for _ in range(100_000):
        fast.evaluate(FLOW_QUERY, f)
        if acc.stats()["data_loads"] == 2:
            break
    assert acc.stats()["data_loads"] == 2 and acc.stats()["stale_data"] >= 1
    before = acc.stats()["vm_answers"]
    g = flow("globex", "api", "acme", "web", "tcp", 443)
    g["src"]["spiffe_id"] = "spiffe://td/tenant/globex/group/api/w"
    assert fast.evaluate(FLOW_QUERY, g)["reasons"] == [
        "revoked-identity: spiffe://td/tenant/globex/group/api/w is revoked"]
    assert acc.stats()["vm_answers"] == before + 1


def test_each_thread_has_its_own_vm_and_all_answer_right() -> None:
    data = small_doc()
    fast, ref, acc = pair(data)
    cases = [(i, ref.evaluate(FLOW_QUERY, i)) for i in corpus(data)[:80]]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for i, want in cases:
                assert fast.evaluate(FLOW_QUERY, i) == want
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert acc.stats()["data_loads"] == 4 and acc.stats()["compiles"] == 1


def test_activating_another_version_recompiles() -> None:
    fast, _, acc = pair()
    f = flow("acme", "web", "globex", "api", "tcp", 8443)
    assert fast.evaluate(FLOW_QUERY, f)["allow"] is True
    mods = modules()
    del mods["flows.rego"]
    fast.load(mods)
    assert fast.evaluate(FLOW_QUERY, f) is None  # no flows package any more
    assert acc.stats()["compiles"] == 2


def test_the_switch_off_is_really_off() -> None:
    assert Settings.from_env({}).engines().vm == "auto"
    assert Settings.from_env({"TRUSTFABRIC_REGO_VM": "off"}).engines().vm == "off"
    with pytest.raises(InvalidInput, match="TRUSTFABRIC_REGO_VM"):
        Settings.from_env({"TRUSTFABRIC_REGO_VM": "on"})
    with pytest.raises(InvalidInput, match="rego VM"):
        make_engine(EngineSettings(vm="fast"), "grants")
    on = make_engine(EngineSettings(), "grants", modules(), small_doc())
    off = make_engine(EngineSettings(vm="off"), "grants", modules(), small_doc())
    assert isinstance(on, RegorusEngine) and isinstance(off, RegorusEngine)
    f = flow("acme", "web", "globex", "api", "tcp", 8443)
    assert on.evaluate(FLOW_QUERY, f) == off.evaluate(FLOW_QUERY, f)
    assert off.accelerator is None
    assert on.accelerator is not None and on.accelerator.stats()["vm_answers"] == 1


def test_a_grant_decided_through_the_decider_engine_goes_through_the_vm() -> None:
    """make_engine's default (what the API's grant decider and authorization use) accelerates."""
    engine = make_engine(EngineSettings(), "authz", {"api_authz.rego": modules()["api_authz.rego"]})
    assert authorize(engine, {"id": "p", "role": "admin"}, "grant.create").allow
    assert isinstance(engine, RegorusEngine) and engine.accelerator is not None
    assert engine.accelerator.stats()["vm_answers"] == 1


def test_an_empty_or_dataless_engine() -> None:
    fast, ref, acc = pair(doc({}), modules())
    f = flow("acme", "web", "globex", "api", "tcp", 8443)
    assert fast.evaluate(FLOW_QUERY, f) == ref.evaluate(FLOW_QUERY, f)
    assert acc.stats()["vm_answers"] == 1
    empty = RegorusEngine(accelerator=Accelerator())
    assert empty.evaluate(GRANT_QUERY, {}) is None
    assert empty.accelerator is not None and empty.accelerator.stats()["not_compiled"] == 1


def test_reloads_are_rented_per_generation() -> None:
    """The reload rule (rvm._ThreadVm.rent): reload once this generation's extra interpreter cost reaches a reload's;
    after generations too short to pay a reload back, only at three reloads' worth."""
    from policy.engines.rvm import _ThreadVm

    m = _ThreadVm()
    m.load_seconds = 1.0
    m.observe(1)
    assert m.rent()
    m.owed = 1.0
    assert not m.rent()
    m.observe(2)  # a new generation: nothing owed yet
    assert m.owed == 0.0 and m.rent()
    for gen in range(3, 8):
        for _ in range(10):
            m.observe(gen)
    m.saving = 0.01  # 10 decisions x 0.01 s saved < 2 reloads: not worth reloading soon
    m.observe(8)
    m.owed = 1.5
    assert m.rent()
    m.owed = 3.0
    assert not m.rent()
