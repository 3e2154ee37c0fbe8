"""The activation check (issue 13, item 5): a version whose decisions on the current data take longer than a
stated budget is not put in force.

Why at activation: regorus cannot be interrupted and holds the interpreter lock while it evaluates, so a
decision on the request path (a grant decision, explain) cannot be cut short; the version must be shown
fast before it decides anything. `measure` runs in the policy sandbox (policy/sandbox.py, so a version
that never finishes meets the CPU limit there, not in the server) and times, in CPU time, the candidate's
grant decision, flow decision (the slowest of a few representative inputs drawn from the data: a flow
inside a tenant, one across tenants, an unknown identity) and its whole allowed flow set. The per-tenant
quotas (core/quotas.py) bound how much the data can grow after the check.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policy.data import DATA_KEY
from policy.decide import ALLOWED_FLOWS_QUERY, FLOW_QUERY, GRANT_QUERY
from policy.engines import scratch_engine
from policy.errors import PolicyBudgetExceeded, PolicyEngineError


@dataclass(frozen=True)
class DecisionBudget:
    decision_ms: float = 50.0  # one grant or flow decision: the most a request waits on the policy
    flow_set_ms: float = 2000.0  # the whole allowed flow set (the flow matrix, impact, the enforcer's compile)


@dataclass(frozen=True)
class DecisionCosts:
    grant_ms: float
    flow_ms: float
    flow_set_ms: float


def _sides(data: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(tenant, group, a port it exposes) for the first group of up to two tenants that have groups."""
    out: list[tuple[str, str, int]] = []
    tenants = data.get(DATA_KEY, {}).get("tenants", {})
    for tenant in sorted(tenants):
        groups = tenants[tenant].get("groups") or {}
        for group in sorted(groups)[:2]:
            ports = [p for ps in (groups[group].get("exposed") or {}).values() for p in ps]
            out.append((tenant, group, ports[0] if ports else 443))
        if len({t for t, _, _ in out}) >= 2:
            break
    return out


def sample_inputs(data: Mapping[str, Any], now_ns: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(grant request inputs, flow inputs) that exercise the policy on `data`."""
    sides = _sides(data)
    a = sides[0] if sides else ("tf-budget-a", "x", 443)
    b = next((s for s in sides if s[0] != a[0]), ("tf-budget-b", "y", 443))
    c = next((s for s in sides if s[0] == a[0] and s[1] != a[1]), (a[0], "tf-budget-z", a[2]))

    def flow(src: tuple[str, str, int], dst: tuple[str, str, int]) -> dict[str, Any]:
        return {"src": {"tenant": src[0], "group": src[1]}, "dst": {"tenant": dst[0], "group": dst[1]},
                "proto": "tcp", "port": dst[2], "now_ns": now_ns}

    unknown = ("tf-budget-unknown", "nowhere", 1)
    grants = [{"requester": {"tenant": a[0]}, "src": {"tenant": a[0], "group": a[1]},
               "dst": {"tenant": b[0], "group": b[1]}, "proto": "tcp", "ports": [b[2]], "ttl_seconds": 3600}]
    return grants, [flow(a, c), flow(a, b), flow(unknown, a)]


def _timed(engine: Any, query: str, input: Any) -> float:
    start = time.process_time()
    with contextlib.suppress(PolicyEngineError):  # an error is a deny on the request path; the time counts
        engine.evaluate(query, input)
    return (time.process_time() - start) * 1000


def measure(modules: Mapping[str, str], data: Mapping[str, Any], now_ns: int) -> DecisionCosts:
    """CPU milliseconds of the slowest grant decision, the slowest flow decision and the allowed flow set of
    `modules` on `data`. Run it in the policy sandbox."""
    engine = scratch_engine(modules, data)
    try:
        grants, flows = sample_inputs(data, now_ns)
        return DecisionCosts(
            grant_ms=max(_timed(engine, GRANT_QUERY, i) for i in grants),
            flow_ms=max(_timed(engine, FLOW_QUERY, i) for i in flows),
            flow_set_ms=_timed(engine, ALLOWED_FLOWS_QUERY, {"now_ns": now_ns}),
        )
    finally:
        engine.close()


def check(costs: DecisionCosts, budget: DecisionBudget, version: int | None) -> None:
    """PolicyBudgetExceeded naming the decision, the figure and the budget when one is over it."""
    over = [
        (name, ms, limit, label)
        for name, ms, limit, label in (
            ("grant decision", costs.grant_ms, budget.decision_ms, "decision"),
            ("flow decision", costs.flow_ms, budget.decision_ms, "decision"),
            ("allowed flow set", costs.flow_set_ms, budget.flow_set_ms, "flow-set"),
        )
        if ms > limit
    ]
    if over:
        parts = "; ".join(f"its {name} took {ms:.0f} ms, above the {limit:g} ms {label} budget"
                          for name, ms, limit, label in over)
        raise PolicyBudgetExceeded(f"policy version {version} is not activated: on the current data {parts}")
