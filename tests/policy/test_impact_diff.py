"""Hypothesis: the impact report's target-by-target diff of two compact answers (policy.impact.diff_answers)
equals diffing the two fully expanded flow sets, on generated answers with shared, overlapping, duplicated
and multi-entry targets; a malformed answer is InvalidInput either way. Its RoCEv2 mirrors equal the
difference of the two sets as the wire sees them (a RoCEv2 flow passes when it or its reverse is allowed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from core.rocev2 import is_rocev2
from policy.decide import Flow, expand_allowed
from policy.impact import diff_answers, diff_flow_sets, report_of

SOURCES = ["a/x", "a/y", "b/x", "c/z", "platform/dns"]
TARGETS = [("a", "x", "tcp"), ("b", "x", "tcp"), ("b", "x", "udp"), ("platform", "dns", "udp")]
REASONS = ["intra-tenant", "platform-service", "grant:g1", "grant:g2"]

entries = st.builds(
    lambda target, reason, sources, ports: {"dst_tenant": target[0], "dst_group": target[1], "proto": target[2],
                                             "reason": reason, "sources": sources, "ports": ports},
    st.sampled_from(TARGETS), st.sampled_from(REASONS),
    st.lists(st.sampled_from(SOURCES), max_size=4), st.lists(st.sampled_from([53, 443, 8443]), max_size=3))
answers = st.lists(entries, max_size=8)


@settings(max_examples=300, deadline=None)
@given(before=answers, after=answers, shared=st.lists(entries, max_size=4))
def test_the_target_diff_equals_the_expanded_diff(before: list[Any], after: list[Any], shared: list[Any]) -> None:
    before, after = shared + before, after + shared[::-1]  # shared entries: targets that may stay the same
    assert diff_answers(before, after) == diff_flow_sets(expand_allowed(before), expand_allowed(after))


@pytest.mark.parametrize("bad", [
    {"dst_tenant": "a", "dst_group": "x", "proto": "tcp", "reason": "r", "sources": ["a/y"], "ports": ["443"]},
    {"dst_tenant": "a", "dst_group": "x", "proto": "tcp", "sources": ["a/y"], "ports": [443]},
    {"dst_group": "x", "proto": "tcp", "reason": "r", "sources": ["a/y"], "ports": [443]},
    {"dst_tenant": "a", "dst_group": "x", "proto": "tcp", "reason": "r", "sources": ["nogroup"], "ports": [443]},
])
def test_a_malformed_entry_is_refused_even_where_both_answers_hold_it(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        diff_answers([bad], [bad])
    with pytest.raises(InvalidInput):
        diff_answers("not a list", [])


ROCE_TARGETS = [("a", "x", "udp"), ("a", "y", "udp"), ("b", "x", "udp"), ("a", "x", "tcp")]
roce_entries = st.builds(
    lambda target, reason, sources, ports: {"dst_tenant": target[0], "dst_group": target[1], "proto": target[2],
                                             "reason": reason, "sources": sources, "ports": ports},
    st.sampled_from(ROCE_TARGETS), st.sampled_from(REASONS),
    st.lists(st.sampled_from(["a/x", "a/y", "b/x"]), max_size=3), st.lists(st.sampled_from([53, 4791]), max_size=2))


def _wire(flows: set[Flow]) -> set[Flow]:
    """What passes on the wire: the allowed flows, and the reverse of every allowed RoCEv2 flow."""
    return flows | {f.reversed() for f in flows if is_rocev2(f.proto, f.port)}


@settings(max_examples=300, deadline=None)
@given(before=st.lists(roce_entries, max_size=6), after=st.lists(roce_entries, max_size=6))
def test_the_rocev2_mirrors_are_what_the_wire_opens_and_closes_beyond_the_policy_flows(
        before: list[Any], after: list[Any]) -> None:
    report = report_of("c", "b", before, after)
    pb, pa = set(expand_allowed(before)), set(expand_allowed(after))
    wb, wa = _wire(pb), _wire(pa)
    assert (set(report.opened), set(report.closed)) == (pa - pb, pb - pa)  # the policy's lines, unchanged
    assert report.mirrors_opened == sorted((wa - wb) - pa)
    assert report.mirrors_closed == sorted((wb - wa) - pb)
    assert report.wire_unchanged == {f for f in (pa ^ pb) if f in wb and f in wa}
    out = report.to_dict()
    assert all(m["mirror"] == "rocev2" for m in out["mirrors_opened"] + out["mirrors_closed"])
    assert out["mirrors_opened_count"] == len(report.mirrors_opened)
    assert sum("wire_unchanged" in f for f in out["opened"] + out["closed"]) == len(report.wire_unchanged)


def test_a_rocev2_grant_shows_its_mirror_opening_and_closing_apart_from_the_policy_flows() -> None:
    grant = {"dst_tenant": "globex", "dst_group": "gpu", "proto": "udp", "reason": "grant:g1",
             "sources": ["acme/train"], "ports": [53, 4791]}
    opens = report_of("c", "b", [], [grant]).to_dict()
    train_gpu = {"src_tenant": "acme", "src_group": "train", "dst_tenant": "globex", "dst_group": "gpu",
                 "proto": "udp"}
    gpu_train = {"src_tenant": "globex", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "train",
                 "proto": "udp"}
    # the policy's flows as before (a consumer reading opened/opened_count sees no change), the mirror beside them
    assert opens["opened"] == [{**train_gpu, "port": 53}, {**train_gpu, "port": 4791}]
    assert opens["opened_count"] == 2 and opens["closed_count"] == 0
    assert opens["mirrors_opened"] == [{**gpu_train, "port": 4791, "mirror": "rocev2"}]
    assert opens["mirrors_opened_count"] == 1 and opens["mirrors_closed"] == []
    closes = report_of("c", "b", [grant], []).to_dict()
    assert closes["mirrors_closed"] == [{**gpu_train, "port": 4791, "mirror": "rocev2"}]
    assert closes["mirrors_opened"] == []
    # a grant the other way already in force: the reverse passes as a policy flow, no mirror line; and swapping
    # one direction for the other changes the policy lines only, which say so
    back = {"dst_tenant": "acme", "dst_group": "train", "proto": "udp", "reason": "grant:g2",
            "sources": ["globex/gpu"], "ports": [4791]}
    both = report_of("c", "b", [back], [back, grant]).to_dict()
    assert both["mirrors_opened"] == [] and {**train_gpu, "port": 4791, "wire_unchanged": "rocev2"} in both["opened"]
    swap = report_of("c", "b", [back], [grant]).to_dict()
    assert swap["mirrors_opened"] == swap["mirrors_closed"] == []
    assert swap["closed"] == [{**gpu_train, "port": 4791, "wire_unchanged": "rocev2"}]
