"""Shared test helpers: the shipped policy run through the embedded regorus engine on a fabric's data."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from enforcer.compiler import Budget, Compiled, compile_fabric
from enforcer.fabric import Fabric, policy_data, revoked_ids
from enforcer.fabric_file import load_fabric_file
from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engines.embedded import RegorusEngine
from policy.versions import load_dir

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "enforcer" / "examples" / "small.yaml"
GOLDEN = Path(__file__).resolve().parent / "golden"
NOW_NS = 1_800_000_000 * 10**9  # 2027-01-15, before the example grant expires


@cache
def modules() -> dict[str, str]:
    return dict(load_dir(ROOT / "rego"))


def allowed_flows(fabric: Fabric, now_ns: int = NOW_NS, data: dict[str, Any] | None = None) -> Any:
    """data.flows.allowed_flows of the shipped policy over the fabric's own tenants, groups and grants."""
    doc = data if data is not None else policy_data(fabric)
    doc["tf"]["now_ns"] = now_ns
    return RegorusEngine(modules(), doc).evaluate(ALLOWED_FLOWS_QUERY, {})


def small() -> Fabric:
    return load_fabric_file(SMALL)


def compile_small(fabric: Fabric | None = None, now_ns: int = NOW_NS, budget: Budget | None = None
                  ) -> tuple[Compiled, Any]:
    f = fabric or small()
    allowed = allowed_flows(f, now_ns)
    return compile_fabric(f, allowed, revoked_ids(f), budget), allowed
