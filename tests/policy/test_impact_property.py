"""Hypothesis: the impact report's diff equals the difference of the two allowed sets computed
independently in Python (tests/policy/helpers.reference_allowed), on generated inventories."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.impact import diff_flow_sets, impact_of
from policy.versions import version_hash
from tests.policy.conftest import LOADED
from tests.policy.helpers import NOW_NS, doc, group, reference_allowed, shipped

TENANTS = ["a", "b", "c", "platform"]
GROUPS = ["x", "y", "z"]
PORTS = [("tcp", 443), ("tcp", 8080), ("udp", 53)]

CANDIDATE = shipped()
BASELINE = {k: v for k, v in shipped().items() if k != "flows_test.rego"}
BASELINE["flows.rego"] = BASELINE["flows.rego"].replace(
    'platform_tenant := "platform"', 'platform_tenant := "nowhere"', 1
)


@st.composite
def inventories(draw: st.DrawFn) -> dict[str, Any]:
    tenants: dict[str, Any] = {}
    for t in draw(st.lists(st.sampled_from(TENANTS), min_size=1, max_size=4, unique=True)):
        groups = {}
        for g in draw(st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True)):
            ports = draw(st.lists(st.sampled_from(PORTS), max_size=3, unique=True))
            groups[g] = group(ports, quarantined=draw(st.integers(0, 3)) == 0)
        tenants[t] = {"quarantined": draw(st.integers(0, 5)) == 0, "groups": groups}
    pairs = [(t, g) for t, v in tenants.items() for g in v["groups"]]
    grants = []
    for n in range(draw(st.integers(0, 6))):
        (stn, sg), (dtn, dg) = draw(st.sampled_from(pairs)), draw(st.sampled_from(pairs))
        grants.append({"id": f"g{n}", "src_tenant": stn, "src_group": sg, "dst_tenant": dtn, "dst_group": dg,
                       "proto": draw(st.sampled_from(["tcp", "udp"])),
                       "ports": draw(st.lists(st.sampled_from([53, 443, 8080, 9000]), min_size=1, max_size=2,
                                              unique=True)),
                       "expires_at_ns": NOW_NS + draw(st.integers(-5, 5))})
    return doc(tenants, grants)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inventories())
def test_impact_diff_equals_the_independent_set_difference(data: dict[str, Any]) -> None:
    after = reference_allowed(data)
    before = reference_allowed(data, platform_rule=False)
    report = impact_of(CANDIDATE, version_hash(CANDIDATE), BASELINE, version_hash(BASELINE), data)
    assert set(report.opened) == after - before
    assert set(report.closed) == before - after
    assert report.unchanged == len(after & before)
    # and the reverse direction closes exactly what the forward one opened
    back = impact_of(BASELINE, "b", CANDIDATE, "c", data)
    assert set(back.closed) == set(report.opened) and set(back.opened) == set(report.closed)


@settings(max_examples=60, deadline=None)
@given(inventories(), inventories())
def test_diff_flow_sets_counts_each_tenant(a: dict[str, Any], b: dict[str, Any]) -> None:
    before, after = reference_allowed(a), reference_allowed(b)
    opened, closed, unchanged, by_tenant = diff_flow_sets(before, after)
    assert set(opened) == after - before and set(closed) == before - after and unchanged == len(before & after)
    for tenant, counts in by_tenant.items():
        assert counts["opened"] == sum(1 for f in opened if tenant in (f.src_tenant, f.dst_tenant))
        assert counts["closed"] == sum(1 for f in closed if tenant in (f.src_tenant, f.dst_tenant))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(inventories())
def test_embedded_and_pdp_agree_on_generated_inventories(pdp: Any, data: dict[str, Any]) -> None:
    from policy.decide import ALLOWED_FLOWS_QUERY, FLOW_QUERY
    from policy.engines.embedded import RegorusEngine
    from policy.engines.opa_server import OpaServerEngine, OpaSettings
    from tests.policy.helpers import corpus

    embedded = RegorusEngine(CANDIDATE, data)
    server = OpaServerEngine(OpaSettings(url=pdp.url, token=pdp.token, timeout=LOADED))
    server.load(CANDIDATE, data)
    batch = corpus(data)
    assert server.evaluate_many(FLOW_QUERY, batch) == embedded.evaluate_many(FLOW_QUERY, batch)
    assert server.evaluate(ALLOWED_FLOWS_QUERY) == embedded.evaluate(ALLOWED_FLOWS_QUERY)
    server.close()
    embedded.close()
