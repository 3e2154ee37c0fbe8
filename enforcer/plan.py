"""Plan: what applying a new rule set changes on each device, as a pure function of the two sets.

The persistence layer (a later issue) stores versioned rule sets and calls this against what each device
last applied; staged mode calls it against a candidate policy's compile without applying anything.
A rule is compared with its address sets resolved, so a group gaining a member shows as a changed rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from enforcer.compiler import Budget
from enforcer.ir import ANY, DeviceRuleSet, FlowRule, Leak

Resolved = tuple[FlowRule, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class DevicePlan:
    device: str
    old_hash: str | None  # None: nothing applied yet
    new_hash: str | None  # None: the device leaves the fabric
    added: tuple[Resolved, ...]
    removed: tuple[Resolved, ...]
    leaks_added: tuple[tuple[str, Leak], ...]  # (vrf, leak)
    leaks_removed: tuple[tuple[str, Leak], ...]
    cost_before: int
    cost_after: int
    limit: int
    # over budget, fitted by withholding (enforcer.fairshare): (tenant, entries, cost) per tenant over its share
    withheld: tuple[tuple[str, int, int], ...] = ()

    @property
    def changed(self) -> bool:
        return self.old_hash != self.new_hash

    def summary(self) -> dict[str, Any]:
        """What an audit event or a staged-mode report carries for this device."""
        out: dict[str, Any] = {"device": self.device, "old_hash": self.old_hash, "new_hash": self.new_hash,
                               "rules_added": len(self.added), "rules_removed": len(self.removed),
                               "leaks_added": len(self.leaks_added), "leaks_removed": len(self.leaks_removed),
                               "budget": {"before": self.cost_before, "after": self.cost_after,
                                          "limit": self.limit}}
        if self.withheld:  # what the new set withholds to fit the budget (the same key as a publish event's)
            out["withheld"] = [{"tenant": t, "entries": n, "cost": c} for t, n, c in self.withheld]
        return out


def _resolved(rs: DeviceRuleSet | None) -> set[Resolved]:
    if rs is None:
        return set()
    sets = rs.set_by_name

    def members(name: str) -> tuple[str, ...]:
        return ("*",) if name == ANY else sets[name].v4 + sets[name].v6

    return {(r, members(r.src), members(r.dst)) for r in rs.rules}


def _leaks(rs: DeviceRuleSet | None) -> set[tuple[str, Leak]]:
    return set() if rs is None else {(v.name, lk) for v in rs.vrfs for lk in v.leaks}


def plan_device(old: DeviceRuleSet | None, new: DeviceRuleSet | None, budget: Budget) -> DevicePlan:
    if old is None and new is None:
        raise ValueError("plan_device needs at least one rule set")
    device = (new or old).device  # type: ignore[union-attr]
    kind = (new or old).kind  # type: ignore[union-attr]
    a, b = _resolved(old), _resolved(new)
    la, lb = _leaks(old), _leaks(new)
    return DevicePlan(device, old.content_hash if old else None, new.content_hash if new else None,
                      tuple(sorted(b - a)), tuple(sorted(a - b)), tuple(sorted(lb - la)), tuple(sorted(la - lb)),
                      old.cost if old else 0, new.cost if new else 0, budget.limit(kind))


def summary(old: DeviceRuleSet | None, new: DeviceRuleSet, budget: Budget) -> dict[str, Any]:
    """plan_device(old, new, budget).summary() without listing (sorting) the rules: what an audit event of a
    publication carries, for every device of a first compile too."""
    a, b = _resolved(old), _resolved(new)
    la, lb = _leaks(old), _leaks(new)
    return {"device": new.device, "old_hash": old.content_hash if old else None, "new_hash": new.content_hash,
            "rules_added": len(b - a), "rules_removed": len(a - b), "leaks_added": len(lb - la),
            "leaks_removed": len(la - lb),
            "budget": {"before": old.cost if old else 0, "after": new.cost, "limit": budget.limit(new.kind)}}


def plan(old: Mapping[str, DeviceRuleSet], new: Mapping[str, DeviceRuleSet], budget: Budget | None = None,
         withheld: Mapping[str, tuple[tuple[str, int, int], ...]] | None = None) -> list[DevicePlan]:
    """One DevicePlan per device whose rule set differs (by content hash), in device order; and one per device
    whose new set withholds entries to fit its budget (`withheld`: device -> (tenant, entries, cost)), changed or
    not, so a plan always shows what is withheld."""
    budget = budget or Budget()
    withheld = withheld or {}
    out = []
    for d in sorted(set(old) | set(new)):
        o, n = old.get(d), new.get(d)
        w = withheld.get(d, ()) if n is not None else ()
        if o is not None and n is not None and o.canonical == n.canonical and not w:
            continue
        p = plan_device(o, n, budget)
        out.append(replace(p, withheld=w) if w else p)
    return out
