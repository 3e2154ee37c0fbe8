"""Impact report: exactly which flows a candidate policy opens and closes against the active one.

Both answers are compared in their compact form (policy.matrix: one entry per destination group, proto and
reason, with its sources and ports) target by target, where a target is a (destination tenant, group, proto):
a target whose entries are the same under both versions allows the same flows, so only the targets that
differ are expanded to flows. A policy change touches a few targets; expanding both whole answers (~240k
flows each at 1,000 tenants x 10 groups) cost seconds. The result is the one `diff_flow_sets` gives on the
expanded sets (tests/policy/test_impact_diff.py holds the two equal on generated answers).

RoCEv2 (udp/4791, core/rocev2.py) is symmetric on the wire: the SuperNICs let B's RoCEv2 reach A wherever the
policy allows A -> B udp/4791. `opened` and `closed` stay the policy's flows (their counts are what a console
confirmation compares); what the devices do besides is reported beside them, never as a policy flow:
- `mirrors_opened` / `mirrors_closed`: B -> A udp/4791 that opens (closes) on the wire only as the mirror of an
  opened (closed) A -> B, each marked `"mirror": "rocev2"` (its origin is the same flow reversed);
- `"wire_unchanged": "rocev2"` on an opened (closed) policy flow that passed before (still passes after) as the
  mirror of its reverse: the policy line changes, the wire does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.rocev2 import MIRROR, is_rocev2
from policy.consistency import Consistency, Disagreement, check
from policy.decide import ALLOWED_FLOWS_QUERY, Flow, expand_allowed
from policy.engines import scratch_engine
from policy.errors import PolicyEngineError
from policy.matrix import Target, by_target, same_entries, validated


@dataclass(frozen=True)
class ImpactReport:
    candidate_hash: str
    baseline_hash: str | None  # None: nothing active, so everything is denied today
    opened: list[Flow] = field(default_factory=list)
    closed: list[Flow] = field(default_factory=list)
    unchanged: int = 0
    by_tenant: dict[str, dict[str, int]] = field(default_factory=dict)
    mirrors_opened: list[Flow] = field(default_factory=list)  # RoCEv2 that opens on the wire as a mirror only
    mirrors_closed: list[Flow] = field(default_factory=list)
    wire_unchanged: frozenset[Flow] = frozenset()  # policy flows of opened/closed that pass before and after
    consistency: Consistency | None = None  # decision vs allowed_flows under the candidate (policy/consistency.py)

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        return {
            "candidate_hash": self.candidate_hash,
            "baseline_hash": self.baseline_hash,
            "opened_count": len(self.opened),
            "closed_count": len(self.closed),
            "unchanged": self.unchanged,
            "opened": [self._policy_flow(f) for f in self.opened[:limit]],
            "closed": [self._policy_flow(f) for f in self.closed[:limit]],
            "by_tenant": self.by_tenant,
            "mirrors_opened_count": len(self.mirrors_opened),
            "mirrors_closed_count": len(self.mirrors_closed),
            "mirrors_opened": [{**f._asdict(), "mirror": MIRROR} for f in self.mirrors_opened[:limit]],
            "mirrors_closed": [{**f._asdict(), "mirror": MIRROR} for f in self.mirrors_closed[:limit]],
            # flows on which the candidate's decision (explain) and allowed_flows (the devices) disagree:
            # activation is refused while there is any
            "consistency": self.consistency.to_dict() if self.consistency is not None else None,
            "disagreements_count": len(self.disagreements),
            "disagreements": [d.to_dict() for d in self.disagreements[:limit]],
        }

    @property
    def disagreements(self) -> list[Disagreement]:
        return self.consistency.disagreements if self.consistency is not None else []

    def _policy_flow(self, f: Flow) -> dict[str, Any]:
        out = f._asdict()
        if self.wire_unchanged and f in self.wire_unchanged:
            out["wire_unchanged"] = MIRROR
        return out


def _by_tenant(opened: list[Flow], closed: list[Flow]) -> dict[str, dict[str, int]]:
    """Per tenant {"opened", "closed"}: a flow counts for its source and its destination tenant (once when equal)."""
    by_tenant: dict[str, dict[str, int]] = {}
    for kind, flows in (("opened", opened), ("closed", closed)):
        for f in flows:
            for tenant in {f.src_tenant, f.dst_tenant}:
                entry = by_tenant.setdefault(tenant, {"opened": 0, "closed": 0})
                entry[kind] += 1
    return dict(sorted(by_tenant.items()))


def diff_flow_sets(
    before: Iterable[Flow], after: Iterable[Flow]
) -> tuple[list[Flow], list[Flow], int, dict[str, dict[str, int]]]:
    """(opened, closed, unchanged count, per tenant {"opened", "closed"}), lists sorted.
    A flow counts for its source tenant and for its destination tenant (once when they are equal)."""
    b, a = set(before), set(after)
    opened, closed = sorted(a - b), sorted(b - a)
    return opened, closed, len(a & b), _by_tenant(opened, closed)


def _count(entries: list[Any]) -> int:
    """Distinct (source, port) pairs of one target's entries: its number of flows; InvalidInput for a source
    that is not tenant/group (as expand_allowed refuses it)."""
    sources = {s for e in entries for s in e["sources"]}
    bad = next((s for s in sources if "/" not in str(s)), None)
    if bad is not None:
        raise InvalidInput(f"data.flows.allowed_flows names a source {str(bad)!r:.100} that is not tenant/group")
    if len(entries) == 1:
        return len(sources) * len({int(p) for p in entries[0]["ports"]})
    return len({(s, int(p)) for e in entries for s in e["sources"] for p in e["ports"]})


def diff_answers(before: Any, after: Any) -> tuple[list[Flow], list[Flow], int, dict[str, dict[str, int]]]:
    """diff_flow_sets(expand_allowed(before), expand_allowed(after)), without expanding the targets that did
    not change; InvalidInput for a malformed answer."""
    return _diff_targets(by_target(validated(before)), by_target(validated(after)))


def _diff_targets(b: dict[Target, list[Any]], a: dict[Target, list[Any]]
                  ) -> tuple[list[Flow], list[Flow], int, dict[str, dict[str, int]]]:
    opened: list[Flow] = []
    closed: list[Flow] = []
    unchanged = 0
    for key in b.keys() | a.keys():
        old, new = b.get(key, []), a.get(key, [])
        if old and new and same_entries(old, new):
            unchanged += _count(new)
            continue
        fb, fa = set(expand_allowed(old)), set(expand_allowed(new))
        opened.extend(fa - fb)
        closed.extend(fb - fa)
        unchanged += len(fa & fb)
    opened.sort()
    closed.sort()
    return opened, closed, unchanged, _by_tenant(opened, closed)


class _Allows:
    """Whether an answer (by target, validated) allows a flow, as expand_allowed would expand it; each target's
    (source, port) pairs are gathered once, on first use (a platform service's entry names every tenant's
    groups)."""

    def __init__(self, targets: dict[Target, list[Any]]) -> None:
        self._targets = targets
        self._pairs: dict[Target, set[tuple[str, int]]] = {}

    def __call__(self, f: Flow) -> bool:
        key = (f.dst_tenant, f.dst_group, f.proto)
        pairs = self._pairs.get(key)
        if pairs is None:
            pairs = self._pairs[key] = {(str(s), int(p)) for e in self._targets.get(key, ())
                                        for s in e["sources"] for p in e["ports"]}
        return (f"{f.src_tenant}/{f.src_group}", f.port) in pairs


def rocev2_mirrors(opened: list[Flow], closed: list[Flow], b: dict[Target, list[Any]], a: dict[Target, list[Any]]
                   ) -> tuple[list[Flow], list[Flow], frozenset[Flow]]:
    """(mirrors opened, mirrors closed, the policy flows of opened/closed whose wire state does not change), from
    the two answers by target. On the wire a flow passes when the policy allows it or, for RoCEv2, its reverse.
    So B -> A RoCEv2 opens as a mirror only when A -> B opens and neither answer allows B -> A itself (then it is
    a policy line of its own, or passed already); closing is the same; and an opened (closed) flow whose reverse
    the answer before (after) allows passed (passes) anyway."""
    mirrors: tuple[list[Flow], list[Flow]] = ([], [])
    same: set[Flow] = set()
    before, after = _Allows(b), _Allows(a)
    for side, (flows, other, own) in enumerate(((opened, before, after), (closed, after, before))):
        for f in flows:
            if not is_rocev2(f.proto, f.port):
                continue
            m = f.reversed()
            if m == f:
                continue
            if other(m):  # passed before it opened / still passes after it closed
                same.add(f)
            elif not own(m):
                mirrors[side].append(m)
    return sorted(mirrors[0]), sorted(mirrors[1]), frozenset(same)


def answer_under(modules: Mapping[str, str], data: Mapping[str, Any], now_ns: int | None = None) -> Any:
    """The compact allowed_flows answer of `modules` on `data`, computed on a private embedded engine."""
    engine = scratch_engine(modules, data)
    try:
        return engine.evaluate(ALLOWED_FLOWS_QUERY, {} if now_ns is None else {"now_ns": now_ns})
    except (PolicyEngineError, KeyError, TypeError) as exc:
        raise PolicyEngineError(f"cannot compute data.flows.allowed_flows: {exc}") from exc
    finally:
        engine.close()


def opened_closed(before: Any, after: Any) -> tuple[list[Flow], list[Flow]]:
    """(opened, closed) from the two compact answers, sorted; InvalidInput for a malformed answer."""
    opened, closed, _, _ = diff_answers(before, after)
    return opened, closed


def report_of(candidate_hash: str, baseline_hash: str | None, before: Any, after: Any,
              consistency: Consistency | None = None) -> ImpactReport:
    """The report from the two compact answers (`before`: the active version's; [] when none is active) and the
    candidate's consistency check when it was made."""
    b, a = by_target(validated(before)), by_target(validated(after))
    opened, closed, unchanged, by_tenant = _diff_targets(b, a)
    mirrors_opened, mirrors_closed, same = rocev2_mirrors(opened, closed, b, a)
    return ImpactReport(candidate_hash, baseline_hash, opened, closed, unchanged, by_tenant, mirrors_opened,
                        mirrors_closed, same, consistency)


def checked_report(candidate: Mapping[str, str] | None, candidate_hash: str, active: Mapping[str, str] | None,
                   baseline_hash: str | None, before: Any, data: Mapping[str, Any], now_ns: int | None,
                   diff: bool = True) -> tuple[Any, Any, ImpactReport]:
    """(the active version's answer, the candidate's, the report with the candidate's consistency check).
    `before`: the active version's answer when known (None: evaluated from `active`; [] when nothing is active);
    `candidate` None when it is the active version itself (its answer is `before`, checked all the same);
    `diff` False leaves the flow lists empty (the caller has the counts). The candidate's answer and its
    decisions come from one private engine. Module-level and on plain data: the workflows run it in the policy
    sandbox (a candidate is user-supplied Rego)."""
    if before is None:
        before = answer_under(active, data, now_ns) if active is not None else []
    modules = candidate if candidate is not None else active
    if modules is None:  # nothing active, and the "candidate" is that nothing
        return before, before, report_of(candidate_hash, baseline_hash, before, before, Consistency())
    engine = scratch_engine(modules, data)
    try:
        after = before
        if candidate is not None:
            try:
                after = engine.evaluate(ALLOWED_FLOWS_QUERY, {} if now_ns is None else {"now_ns": now_ns})
            except (PolicyEngineError, KeyError, TypeError) as exc:
                raise PolicyEngineError(f"cannot compute data.flows.allowed_flows: {exc}") from exc
        if not diff:
            validated(after)
            return before, after, ImpactReport(candidate_hash, baseline_hash,
                                               consistency=check(engine, after, [], [], data, now_ns))
        b, a = by_target(validated(before)), by_target(validated(after))
        opened, closed, unchanged, by_tenant = _diff_targets(b, a)
        consistency = check(engine, after, opened, closed, data, now_ns)
    finally:
        engine.close()
    mirrors_opened, mirrors_closed, same = rocev2_mirrors(opened, closed, b, a)
    return before, after, ImpactReport(candidate_hash, baseline_hash, opened, closed, unchanged, by_tenant,
                                       mirrors_opened, mirrors_closed, same, consistency)


def impact_of(
    candidate: Mapping[str, str],
    candidate_hash: str,
    baseline: Mapping[str, str] | None,
    baseline_hash: str | None,
    data: Mapping[str, Any],
    now_ns: int | None = None,
) -> ImpactReport:
    """The report of `candidate` against `baseline` (None: nothing active), with the consistency check."""
    return checked_report(candidate, candidate_hash, baseline, baseline_hash, None, data, now_ns)[2]
