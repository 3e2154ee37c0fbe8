"""The impact report as the API serves it: the flows a candidate version opens and closes against the active
one (by tenant), and the devices whose rule sets it would change, computed once per (candidate version,
active version, data document, fabric, budget) and kept while provably current (api/caches.py, `impact`).

What one report costs is two compact allowed_flows answers, their target-by-target diff (policy/impact.py)
and, when a fabric exists, two compiles. The active version's answer and its data document are the ones the
flow matrix keeps (policy/flowset.py): when that kept set is current in this report's own read transaction
(same data fingerprint, same active version, same instant window), the report evaluates only the candidate.

A candidate version is user-supplied Rego: whatever is evaluated for a report (the candidate, and the active
version when the kept set is not current, and the candidate's consistency check: policy/consistency.py) runs
in one policy sandbox job (policy.impact.checked_report, issue 13 item 5), after the read transaction
ends; a runaway candidate is refused (422) naming the CPU budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlmodel import Session

from core.once import OncePerKey
from enforcer.compiler import Budget, compile_fabric
from enforcer.fabric import Fabric
from enforcer.fabric_db import compile_fabric_of
from enforcer.plan import plan
from policy.data import build_data, data_fingerprint, live_until, to_ns
from policy.flowset import FlowSet, FlowSets
from policy.impact import ImpactReport, checked_report
from policy.sandbox import Limits, run_limited
from policy.service import active_version, get_version
from store.db import Database


def device_section(fabric: Fabric, before: Any, after: Any, revoked: frozenset[str], budget: Budget
                   ) -> dict[str, Any] | None:
    """The per-device section: both answers compiled on the fabric, and which devices' rule sets differ
    (rules added and removed); None without a fabric."""
    if not fabric.nodes and not fabric.switches:
        return None
    new = compile_fabric(fabric, after, revoked, budget)
    if not new.devices:
        return None
    if after is before or after == before:  # the compiler is pure: the same answer, the same rule sets
        return {"devices": len(new.devices), "touched": 0, "by_device": []}
    old = compile_fabric(fabric, before, revoked, budget)
    changes = plan(old.devices, new.devices, budget)
    return {"devices": len(new.devices), "touched": len(changes),
            "by_device": [{"device": p.device, "rules_added": len(p.added), "rules_removed": len(p.removed),
                           "leaks_added": len(p.leaks_added), "leaks_removed": len(p.leaks_removed),
                           "budget": {"before": p.cost_before, "after": p.cost_after, "limit": p.limit}}
                          for p in changes]}


@dataclass(frozen=True)
class Impact:
    """One computed report: the flows part, the device part, and the instants it holds for."""

    flows: ImpactReport
    devices: dict[str, Any] | None
    computed_at_ns: int
    valid_until_ns: int | None  # earliest grant expiry in the data it was computed from

    def to_dict(self, limit: int | None) -> dict[str, Any]:
        return {**self.flows.to_dict(limit=limit), "devices": self.devices}

    def fresh_at(self, now_ns: int) -> bool:
        return self.computed_at_ns <= now_ns and (self.valid_until_ns is None or now_ns < self.valid_until_ns)


@dataclass(frozen=True)
class Inputs:
    """What one report reads, in one snapshot: both versions, the data document, the fabric, and the active
    version's answer when the kept flow set is current in that snapshot."""

    name: str  # the candidate's number, as the sandbox's refusal names it
    candidate: dict[str, str]
    candidate_hash: str
    active: dict[str, str] | None
    digest: str | None  # the active version's content hash
    data: Mapping[str, Any]
    fabric: Fabric
    now_ns: int
    valid_until_ns: int | None
    before: Any | None  # the active version's answer, from the kept flow set (None: evaluate it)
    counts: dict[Any, int] | None  # the kept set's counts, when `before` is its answer
    key: tuple[Any, ...] | None  # the cache key, or None when the report cannot be kept


def read(session: Session, ref: str, *, now: datetime, budget: Budget, kept: FlowSet | None = None) -> Inputs:
    """The inputs of version `ref`'s report at `now`, in `session` (one snapshot: see Database.read_session).
    `kept`: the active version's flow set, used when it is provably what this session reads."""
    from pki.service import trust_domain

    candidate = get_version(session, ref)
    active = active_version(session)
    digest = active.content_hash if active is not None else None
    fingerprint = data_fingerprint(session) if kept is not None else None
    fabric = compile_fabric_of(session, trust_domain(session) or "")
    modules = dict(active.modules) if active is not None else None
    if (kept is not None and kept.data is not None and fingerprint is not None and kept.fingerprint == fingerprint
            and kept.policy_hash == digest and kept.fresh_at(now)):
        data, before, valid_until, counts = kept.data, kept.raw, kept.valid_until_ns, kept.counts
    else:
        data, before, counts = build_data(session, now), None, None
        valid_until, fingerprint = live_until(data), None
    key = (candidate.content_hash, digest, fingerprint, fabric, budget) if fingerprint is not None else None
    name = str(candidate.number) if candidate.number is not None else candidate.content_hash[:16]
    return Inputs(name, dict(candidate.modules), candidate.content_hash, modules, digest, data, fabric,
                  to_ns(now), valid_until, before, counts, key)


def evaluate(inputs: Inputs, *, budget: Budget, limits: Limits) -> Impact:
    """The report from `inputs`: what is not known yet evaluated, the diff, and the candidate's decision checked
    against its allowed_flows (policy/consistency.py), in one sandbox job; then the compiles in this process
    (our code, on the answers)."""
    same = inputs.candidate_hash == inputs.digest
    counted = same and inputs.counts is not None  # the active version against itself: its kept counts say all
    before, after, flows = run_limited(
        checked_report, None if same else inputs.candidate, inputs.candidate_hash, inputs.active, inputs.digest,
        inputs.before, dict(inputs.data), inputs.now_ns, not counted, limits=limits,
        what=f"the impact report of policy version {inputs.name}")
    if counted and inputs.counts is not None:
        flows = replace(flows, unchanged=sum(inputs.counts.values()))
    devices = device_section(inputs.fabric, before, after, frozenset(inputs.data["tf"]["revoked"]), budget)
    return Impact(flows, devices, inputs.now_ns, inputs.valid_until_ns)


def compute(db: Database, ref: str, *, now: datetime, budget: Budget, limits: Limits) -> Impact:
    """Version `ref`'s report against the active one at `now`, computed afresh (nothing kept is used)."""
    with db.read_session(snapshot=True) as session:
        inputs = read(session, ref, now=now, budget=budget)
    return evaluate(inputs, budget=budget, limits=limits)


class ImpactReports:
    """Kept reports, a few per process (LRU). `flow_sets`: the app's kept active flow set; `keep=False`
    computes every report afresh (TRUSTFABRIC_CACHE_OFF=impact). `changes`: the database's change counter
    (SQLite's; None on PostgreSQL, where the key is read on every request: one row, policy.data)."""

    def __init__(self, db: Database, flow_sets: FlowSets | None, *, keep: bool = True, size: int = 8,
                 changes: Callable[[], int | None] = lambda: None) -> None:
        self._db = db
        self._flow_sets = flow_sets if keep else None
        self._size = size
        self._changes = changes
        self._kept: OrderedDict[tuple[Any, ...], Impact] = OrderedDict()
        # (ref, budget) -> (the key it was last found current under, the change counter then): while nothing
        # committed since (the counter is the same), that key is still the one a read would find
        self._seen: dict[tuple[str, Budget], tuple[tuple[Any, ...], int]] = {}
        self._lock = threading.Lock()
        self._jobs: OncePerKey | None = None  # reports report_or_start began, made on the first
        self.computations = 0  # for tests and the benchmark

    def report(self, ref: str, *, now: datetime, budget: Budget, limits: Limits, limit: int | None
               ) -> dict[str, Any]:
        """Version `ref`'s report at `now` (to_dict with `limit` flows a side); a candidate that has to be
        evaluated runs in the policy sandbox under `limits`."""
        version = self._changes() if self._flow_sets is not None else None  # before any read
        unchanged = self._unchanged(ref, budget, version, to_ns(now))
        if unchanged is not None:
            return unchanged.to_dict(limit)
        kept = self._flow_sets.current(now) if self._flow_sets is not None else None
        with self._db.read_session(snapshot=True) as session:  # the key and the inputs agree
            if kept is not None:
                _key, hit = self._hit(session, ref, budget, version, to_ns(now))
                if hit is not None:
                    return hit.to_dict(limit)
            inputs = read(session, ref, now=now, budget=budget, kept=kept)
        impact = evaluate(inputs, budget=budget, limits=limits)  # outside the read transaction
        key = inputs.key
        self.computations += 1
        if key is not None:
            with self._lock:
                self._kept[key] = impact
                self._kept.move_to_end(key)
                while len(self._kept) > self._size:
                    self._kept.popitem(last=False)
            self._remember(ref, budget, key, version)
        return impact.to_dict(limit)

    def report_or_start(self, ref: str, *, clock: Callable[[], datetime], budget: Budget, limits: Limits,
                        limit: int | None) -> dict[str, Any] | None:
        """Version `ref`'s report at clock() when it is kept and provably current; otherwise None, with its
        computation started in the background (one per version and budget at a time, at the instant it
        starts) for a later call to find, or the error of the last one raised once (core.once). A report
        that cannot be kept (keep=False, a database without the data version) is computed and waited for."""
        now = clock()
        if self._flow_sets is None:
            return self.report(ref, now=now, budget=budget, limits=limits, limit=limit)
        if self._jobs is not None and self._jobs.running((ref, budget)):
            return None  # being computed: "computing" without a read (never stale; found on a later ask)
        version = self._changes()  # before any read
        unchanged = self._unchanged(ref, budget, version, to_ns(now))
        if unchanged is not None:
            return unchanged.to_dict(limit)
        with self._db.read_session(snapshot=True) as session:
            key, hit = self._hit(session, ref, budget, version, to_ns(now))
        if hit is not None:
            return hit.to_dict(limit)
        if key is None:
            return self.report(ref, now=now, budget=budget, limits=limits, limit=limit)
        with self._lock:
            jobs = self._jobs = self._jobs or OncePerKey("tf-impact")
        jobs.start((ref, budget), lambda: self.report(ref, now=clock(), budget=budget, limits=limits, limit=0))
        return None

    def wait_started(self, timeout: float) -> bool:
        """Whether the reports started by report_or_start finished within `timeout` s (tests, the benchmark)."""
        return self._jobs is None or self._jobs.wait(timeout)

    def stop_background(self) -> None:
        """Start no more background reports (a running one ends on its own, within the sandbox's limits)."""
        if self._jobs is not None:
            self._jobs.close()

    def _unchanged(self, ref: str, budget: Budget, version: int | None, now_ns: int) -> Impact | None:
        if version is None:
            return None
        with self._lock:
            seen = self._seen.get((ref, budget))
            hit = self._kept.get(seen[0]) if seen is not None and seen[1] == version else None
        return hit if hit is not None and hit.fresh_at(now_ns) else None

    def _hit(self, session: Session, ref: str, budget: Budget, version: int | None, now_ns: int
             ) -> tuple[tuple[Any, ...] | None, Impact | None]:
        """(this session's cache key, the report kept under it when fresh at `now_ns`, else None)."""
        key = self._key(session, ref, budget)
        with self._lock:
            hit = self._kept.get(key) if key is not None else None
        if key is None or hit is None or not hit.fresh_at(now_ns):
            return key, None
        self._remember(ref, budget, key, version)
        return key, hit

    def _remember(self, ref: str, budget: Budget, key: tuple[Any, ...], version: int | None) -> None:
        if version is None:
            return
        with self._lock:
            if len(self._seen) >= 64 * self._size:
                self._seen.clear()
            self._seen[(ref, budget)] = (key, version)

    def _key(self, session: Session, ref: str, budget: Budget) -> tuple[Any, ...] | None:
        """The cache key of this session's state, read in its transaction (None: nothing is keyable)."""
        from pki.service import trust_domain

        candidate = get_version(session, ref)
        active = active_version(session)
        fingerprint = data_fingerprint(session)
        if fingerprint is None:
            return None
        return (candidate.content_hash, active.content_hash if active is not None else None, fingerprint,
                compile_fabric_of(session, trust_domain(session) or ""), budget)
