"""Hypothesis: the impact report's target-by-target diff of two compact answers (policy.impact.diff_answers)
equals diffing the two fully expanded flow sets, on generated answers with shared, overlapping, duplicated
and multi-entry targets; a malformed answer is InvalidInput either way."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput
from policy.decide import expand_allowed
from policy.impact import diff_answers, diff_flow_sets

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
