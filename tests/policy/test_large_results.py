"""Large answers (RegorusEngine's `large_results`, allowed_flows) come back whole and leave the cyclic garbage
collector as they found it: decoded with it paused (policy/engines/embedded.py `_loads_large`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from policy.engines.embedded import RegorusEngine

MODULE = """package big
import rego.v1
rows contains {"n": n, "ports": [n, n + 1]} if some n in numbers.range(1, 3000)
"""


@pytest.fixture
def engine() -> Iterator[RegorusEngine]:
    e = RegorusEngine({"big.rego": MODULE}, {}, large_results=("data.big.rows",))
    yield e
    e.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_large_answer_is_whole_and_the_collector_is_left_as_found(engine: RegorusEngine, enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        rows = engine.evaluate("data.big.rows", {})
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert len(rows) == 3000
    assert sorted(r["n"] for r in rows) == list(range(1, 3001))
    assert all(r["ports"] == [r["n"], r["n"] + 1] for r in rows)


def test_a_large_answer_keeps_json_shapes_sets_come_back_as_lists() -> None:
    """Decoded from JSON like every answer, not converted natively (eval_rule gives Python sets, and fails on a
    set of objects): a candidate policy whose allowed_flows holds sets gets the lists any other query would."""
    module = 'package big\nimport rego.v1\nrows := [{"sources": {"b/x", "a/y"}, "tags": {{"k": 1}}}]\n'
    engine = RegorusEngine({"big.rego": module}, {}, large_results=("data.big.rows",))
    try:
        assert engine.evaluate("data.big.rows", {}) == [{"sources": ["a/y", "b/x"], "tags": [{"k": 1}]}]
        assert engine.evaluate("data.big.nothing", {}) is None
    finally:
        engine.close()
