"""policy.matrix against the full expansion: on generated allowed_flows answers (overlapping grants,
grants to platform services, repeated sources and ports), the per tenant-pair counts equal counting
expand_allowed by pair, and one pair's flows are exactly the expanded flows of that pair."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from policy.decide import Flow, expand_allowed
from policy.engines.embedded import RegorusEngine
from policy.matrix import flows_between, mirror_counts, mirrors_between, pair_counts, tenant_totals, top_tenants
from tests.policy.helpers import NOW_NS, doc, group, shipped

TENANTS = ["a", "b", "c", "platform"]
SOURCES = [f"{t}/{g}" for t in TENANTS for g in ("x", "y")]


@st.composite
def answers(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Raw allowed_flows entries, several of them on the same destination group and proto."""
    out = []
    for n in range(draw(st.integers(0, 8))):
        out.append({
            "dst_tenant": draw(st.sampled_from(TENANTS)), "dst_group": draw(st.sampled_from(["x", "y"])),
            "proto": draw(st.sampled_from(["tcp", "udp"])), "reason": f"r{n}",
            "ports": draw(st.lists(st.sampled_from([53, 443, 8080]), min_size=1, max_size=3)),
            "sources": draw(st.lists(st.sampled_from(SOURCES), min_size=0, max_size=5)),
        })
    return out


@settings(max_examples=200, deadline=None)
@given(answers())
def test_counts_equal_the_expanded_set_by_pair(raw: list[dict[str, Any]]) -> None:
    expanded = expand_allowed(raw)
    want = Counter((f.src_tenant, f.dst_tenant) for f in expanded)
    assert pair_counts(raw) == dict(want)
    for src in TENANTS:
        for dst in TENANTS:
            between = flows_between(raw, src, dst)
            assert set(between) == {f for f in expanded if (f.src_tenant, f.dst_tenant) == (src, dst)}
            assert all(between[f] == sorted(set(expanded[f])) for f in between)


@settings(max_examples=200, deadline=None)
@given(answers().map(lambda raw: [{**e, "ports": [4791 if p == 53 else p for p in e["ports"]]} for e in raw]))
def test_mirrors_are_the_wire_s_rocev2_flows_the_policy_does_not_allow(raw: list[dict[str, Any]]) -> None:
    """On the wire a flow passes when the policy allows it or, for RoCEv2 (udp/4791), its reverse: the mirrors of a
    pair are the wire's flows of that pair minus the policy's, each with the reasons of the reverse it mirrors."""
    expanded = expand_allowed(raw)
    for src in TENANTS:
        for dst in TENANTS:
            want = {Flow(f.dst_tenant, f.dst_group, f.src_tenant, f.src_group, f.proto, f.port): sorted(set(r))
                    for f, r in expanded.items() if (f.src_tenant, f.dst_tenant) == (dst, src)
                    and (f.proto, f.port) == ("udp", 4791)}
            want = {m: r for m, r in want.items() if m not in expanded}
            got = mirrors_between(raw, src, dst)
            assert got == want and list(got) == sorted(got)
            assert mirror_counts(raw).get((src, dst), 0) == len(want)


def test_counts_of_the_shipped_policy_on_a_real_engine() -> None:
    """The shipped flows.rego: intra-tenant, platform service and a grant to the platform (counted once)."""
    data = doc({
        "a": {"quarantined": False, "groups": {"x": group([("tcp", 443)]), "y": group([("tcp", 80)])}},
        "b": {"quarantined": False, "groups": {"x": group([("tcp", 443)])}},
        "platform": {"quarantined": False, "groups": {"dns": group([("udp", 53)])}},
    }, [
        {"id": "g1", "src_tenant": "a", "src_group": "x", "dst_tenant": "b", "dst_group": "x", "proto": "tcp",
         "ports": [443], "expires_at_ns": NOW_NS + 10**12},
        {"id": "g2", "src_tenant": "a", "src_group": "x", "dst_tenant": "platform", "dst_group": "dns",
         "proto": "udp", "ports": [53], "expires_at_ns": NOW_NS + 10**12},
    ])
    engine = RegorusEngine(shipped(), data)
    try:
        raw = engine.evaluate("data.flows.allowed_flows", {"now_ns": NOW_NS})
    finally:
        engine.close()  # a regorus engine must not be dropped on another thread later
    counts = pair_counts(raw)
    assert counts == {("a", "a"): 2, ("a", "b"): 1, ("a", "platform"): 2, ("b", "platform"): 1}
    assert sorted(flows_between(raw, "a", "platform").values()) == [["grant:g2", "platform-service"],
                                                                      ["platform-service"]]
    assert tenant_totals(counts) == {"a": 5, "b": 2, "platform": 3}
    assert top_tenants(counts, limit=2) == (["a", "platform"], 3)
    assert top_tenants(counts, search="B") == (["b"], 1)
    assert top_tenants(counts, offset=2) == (["b"], 3)


@pytest.mark.parametrize("raw", [
    None, {"a": 1}, [{"dst_tenant": "a"}], [{"dst_tenant": "a", "dst_group": "x", "proto": "tcp", "reason": "r",
                                             "ports": ["x"], "sources": ["a/y"]}],
    [{"dst_tenant": "a", "dst_group": "x", "proto": "tcp", "reason": "r", "ports": [1], "sources": ["nogroup"]}],
])
def test_a_malformed_answer_is_invalid_input(raw: Any) -> None:
    with pytest.raises(InvalidInput):
        pair_counts(raw)
