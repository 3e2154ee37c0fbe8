"""Impact report: exactly which flows a candidate policy opens and closes against the active one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.decide import Flow, allowed_flow_set
from policy.engines import scratch_engine
from policy.errors import PolicyEngineError


@dataclass(frozen=True)
class ImpactReport:
    candidate_hash: str
    baseline_hash: str | None  # None: nothing active, so everything is denied today
    opened: list[Flow] = field(default_factory=list)
    closed: list[Flow] = field(default_factory=list)
    unchanged: int = 0
    by_tenant: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        return {
            "candidate_hash": self.candidate_hash,
            "baseline_hash": self.baseline_hash,
            "opened_count": len(self.opened),
            "closed_count": len(self.closed),
            "unchanged": self.unchanged,
            "opened": [f._asdict() for f in self.opened[:limit]],
            "closed": [f._asdict() for f in self.closed[:limit]],
            "by_tenant": self.by_tenant,
        }


def diff_flow_sets(
    before: Iterable[Flow], after: Iterable[Flow]
) -> tuple[list[Flow], list[Flow], int, dict[str, dict[str, int]]]:
    """(opened, closed, unchanged count, per tenant {"opened", "closed"}), lists sorted.
    A flow counts for its source tenant and for its destination tenant (once when they are equal)."""
    b, a = set(before), set(after)
    opened, closed = sorted(a - b), sorted(b - a)
    by_tenant: dict[str, dict[str, int]] = {}
    for kind, flows in (("opened", opened), ("closed", closed)):
        for f in flows:
            for tenant in {f.src_tenant, f.dst_tenant}:
                entry = by_tenant.setdefault(tenant, {"opened": 0, "closed": 0})
                entry[kind] += 1
    return opened, closed, len(a & b), dict(sorted(by_tenant.items()))


def flows_under(modules: Mapping[str, str], data: Mapping[str, Any], now_ns: int | None = None) -> set[Flow]:
    """The allowed flow set of `modules` on `data`, computed on a private embedded engine."""
    engine = scratch_engine(modules, data)
    try:
        return set(allowed_flow_set(engine, now_ns))
    except (PolicyEngineError, KeyError, TypeError) as exc:
        raise PolicyEngineError(f"cannot compute data.flows.allowed_flows: {exc}") from exc
    finally:
        engine.close()


def impact_of(
    candidate: Mapping[str, str],
    candidate_hash: str,
    baseline: Mapping[str, str] | None,
    baseline_hash: str | None,
    data: Mapping[str, Any],
    now_ns: int | None = None,
) -> ImpactReport:
    after = flows_under(candidate, data, now_ns)
    before = flows_under(baseline, data, now_ns) if baseline is not None else set()
    opened, closed, unchanged, by_tenant = diff_flow_sets(before, after)
    return ImpactReport(candidate_hash, baseline_hash, opened, closed, unchanged, by_tenant)
