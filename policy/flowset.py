"""The allowed flow set under the active version at one instant, kept per process while provably current.

Computing it means building the data document and evaluating `data.flows.allowed_flows`: about a second
at 1,000 tenants x 10 groups x 5,000 grants. `FlowSets.current` reuses the kept set while a fresh
evaluation would give the same answer (the argument, and why it holds across workers and on PostgreSQL,
is api/caches.py's `flow_set`):

- no commit anywhere since it was known current (a change counter the caller supplies: SQLite's
  `PRAGMA data_version`, read before the data, so a later commit only makes the next call check again);
- or else, in one read transaction (one snapshot: REPEATABLE READ on PostgreSQL), the same policy data
  version (policy.data.data_fingerprint) and the same active version (content hash);
- and in both cases only from the instant it was computed until the earliest expiry of a grant in it.

When neither holds, it is computed again, cheaply after grant changes alone (the common change: a request
approved, a grant revoked): the audit events committed since the kept set was read (every change commits its
event with it) name the grants that changed; when they are grant events only (beside UNRELATED ones), the
same version is active and no grant in the kept document has expired, those grants are patched into the kept document
(policy.data.grant_ops, as the reconciler and the grant decider patch theirs) instead of building it again,
the version is evaluated on the kept engine (on one thread of its own, so regorus keeps its loaded document
and takes in the patch alone), and only the targets whose entries changed are counted again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from sqlmodel import Session, col, select

from audit.service import changes_since, tree_size
from core.once import OncePerKey
from policy.data import build_data, data_fingerprint, grant_ops, live_until, to_ns
from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engines import PolicyEngine, scratch_engine
from policy.impact import answer_under
from policy.matrix import Pair, TargetCounts, mirror_counts, target_counts, totals
from policy.models import Grant
from policy.service import active_version
from store.db import Database

# Audit actions whose changes reach neither the data document, nor the active version, nor the fabric
# (issuing credentials, the enforcer's own events, uploads of candidate versions, exports): the kept set
# and the reconciler's inputs stay what they were after these. Anything else, including an action added
# later, counts as a change.
UNRELATED = ("svid.issue", "svid.jwt.", "node.attest", "node.renew", "node.token.", "token.", "ca.", "policy.upload",
             "audit.", "enforcer.", "device.")
MAX_PATCHED_EVENTS = 1000  # more changes than this since the kept set: build the document again


@dataclass(frozen=True)
class FlowSet:
    """The compact allowed_flows answer at one instant and its per tenant-pair counts."""

    policy_hash: str | None
    computed_at: datetime
    raw: list[Any]
    counts: dict[Pair, int]
    change_version: int | None  # the change counter when it was last known current
    fingerprint: tuple[Any, ...] | None
    valid_until_ns: int | None  # earliest grant expiry in the data it was computed from
    data: Mapping[str, Any] | None = None  # the document it was computed from (the impact report reuses it)
    marker: int | None = None  # the audit log's size when it was read
    targets: TargetCounts | None = None  # the counts by target, for counting again only what changed

    @cached_property
    def mirror_counts(self) -> dict[Pair, int]:
        """RoCEv2 mirrors by tenant pair (policy.matrix.mirror_counts), counted once per set: a pass over every
        entry, kept off each matrix read (a frozen dataclass without slots: the property caches in __dict__)."""
        return mirror_counts(self.raw)

    def fresh_at(self, now: datetime) -> bool:
        """Whether `now` lies in [computed_at, earliest grant expiry): the same grants are live all along."""
        now_ns = to_ns(now)
        return to_ns(self.computed_at) <= now_ns and (self.valid_until_ns is None or now_ns < self.valid_until_ns)


def _no_counter() -> int | None:
    return None


class FlowSets:
    """One kept FlowSet per process. `changes` is a change counter of the database (None: unknown, as on
    PostgreSQL); `keep=False` evaluates on every call (TRUSTFABRIC_CACHE_OFF=flow_set)."""

    def __init__(self, db: Database, *, keep: bool = True, changes: Callable[[], int | None] = _no_counter) -> None:
        self._db = db
        self._keep = keep
        self._changes = changes
        self._kept: FlowSet | None = None
        self._lock = threading.Lock()
        self._engine: PolicyEngine | None = None  # loaded with the kept set's version and document
        self._engine_hash: str | None = None  # the version loaded in it
        self._worker: ThreadPoolExecutor | None = None  # the one thread the kept engine evaluates on
        self._jobs: OncePerKey | None = None  # evaluations current_or_start began, made on the first
        self._lock_jobs = threading.Lock()
        self.evaluations = 0  # for tests and the benchmark
        self.patched = 0  # evaluations on a patched document (tests, the benchmark)

    def stop_background(self) -> None:
        """Start no more background evaluations (a running one ends on its own)."""
        if self._jobs is not None:
            self._jobs.close()

    def close(self) -> None:
        self.stop_background()
        with self._lock:
            self._drop_engine()
            if self._worker is not None:
                self._worker.shutdown(wait=False)
                self._worker = None

    def _unchanged(self, version: int | None, now: datetime) -> FlowSet | None:
        kept = self._kept
        if kept is not None and version is not None and kept.change_version == version and kept.fresh_at(now):
            return kept
        return None

    def current_or_start(self, clock: Callable[[], datetime]) -> FlowSet | None:
        """The set at clock() when it is kept and provably current; otherwise None, with an evaluation
        started in the background (one at a time, at the instant it starts) for a later call to find, or
        the error of the last one raised once (core.once). With keep=False: current(), waited for."""
        now = clock()
        if not self._keep:
            return self.current(now)
        if self._jobs is not None and self._jobs.running("current"):
            return None  # being evaluated: asking again reads nothing meanwhile
        found = self._kept_current(now)
        if found is not None:
            return found
        with self._lock_jobs:
            jobs = self._jobs = self._jobs or OncePerKey("tf-flowset-refresh")
        jobs.start("current", lambda: self.current(clock()))
        return None

    def wait_started(self, timeout: float) -> bool:
        """Whether the evaluations started by current_or_start finished within `timeout` s (tests, bench)."""
        return self._jobs is None or self._jobs.wait(timeout)

    def _kept_current(self, now: datetime) -> FlowSet | None:
        """The kept set when it is provably current at `now` by current()'s checks (the change counter, else
        one snapshot's data version and active version), evaluating nothing and never waiting for an
        evaluation in progress; None otherwise."""
        version = self._changes()
        found = self._unchanged(version, now)
        if found is not None:
            return found
        kept = self._kept
        if kept is None or not kept.fresh_at(now):
            return None
        with self._db.read_session(snapshot=True) as session:
            fingerprint = data_fingerprint(session)
            active = active_version(session)
        digest = active.content_hash if active is not None else None
        if fingerprint is None or kept.fingerprint != fingerprint or kept.policy_hash != digest:
            return None
        if self._lock.acquire(blocking=False):  # remember it for the counter, unless an evaluation is storing
            try:
                if self._kept is kept:
                    self._kept = replace(kept, change_version=version)
            finally:
                self._lock.release()
        return kept

    def current(self, now: datetime) -> FlowSet:
        """The allowed flow set at `now`; InvalidInput when the active version answers something malformed."""
        version = self._changes() if self._keep else None  # before the data: see the module docstring
        found = self._unchanged(version, now)
        if found is not None:
            return found
        with self._lock:  # one evaluation at a time: a burst after a change waits for the first one
            found = self._unchanged(version, now)
            if found is not None:
                return found
            if not self._keep:
                return self._fresh(now)
            kept = self._kept
            with self._db.read_session(snapshot=True) as session:  # the version and the data agree
                fingerprint = data_fingerprint(session)
                active = active_version(session)
                digest = active.content_hash if active is not None else None
                if (kept is not None and fingerprint is not None and kept.fingerprint == fingerprint
                        and kept.policy_hash == digest and kept.fresh_at(now)):
                    self._kept = replace(kept, change_version=version)
                    return self._kept
                marker = tree_size(session)
                data = self._patched(session, kept, digest, marker, now)
                incremental = data is not None
                if data is None:
                    data = build_data(session, now)
                modules = (dict(active.modules) if active is not None and not incremental
                           and digest != self._engine_hash else None)
            raw: Any = []  # no active version: every flow is denied
            if digest is None:
                self._drop_engine()
            else:
                raw = self._evaluate(digest, modules, None if incremental else data, now)
            previous = kept.targets if incremental and kept is not None else None
            targets = target_counts(raw, previous)  # InvalidInput for anything but well-formed entries
            counts = totals(targets, previous, kept.counts if previous is not None and kept is not None else None)
            self.evaluations += 1
            self.patched += incremental
            self._kept = FlowSet(digest, now, raw, counts, version, fingerprint, live_until(data), data, marker,
                                 targets)
            return self._kept

    def _fresh(self, now: datetime) -> FlowSet:
        """Evaluated from scratch, nothing kept (keep=False)."""
        with self._db.read_session(snapshot=True) as session:
            active = active_version(session)
            data = build_data(session, now)
            modules = dict(active.modules) if active is not None else None
        raw: Any = answer_under(modules, data, to_ns(now)) if modules is not None else []
        targets = target_counts(raw)
        self.evaluations += 1
        return FlowSet(active.content_hash if active is not None else None, now, raw, totals(targets), None, None,
                       live_until(data), data, None, targets)

    def _patched(self, session: Session, kept: FlowSet | None, digest: str | None, marker: int, now: datetime
                 ) -> Mapping[str, Any] | None:
        """The kept document with the grants changed since it was read patched in, when grant events are all
        that committed since, the same version is active and nothing in it expired; None otherwise."""
        if (kept is None or self._engine is None or kept.marker is None or digest is None
                or kept.policy_hash != digest or not kept.fresh_at(now) or not kept.marker < marker
                or marker - kept.marker > MAX_PATCHED_EVENTS):
            return None
        events, complete = changes_since(session, kept.marker, marker, MAX_PATCHED_EVENTS)
        if not complete or not all(action.startswith(("grant.", *UNRELATED)) for action, _ in events):
            return None
        engine = self._engine
        ids = {object_id for action, object_id in events if action.startswith("grant.")}
        for grant in session.exec(select(Grant).where(col(Grant.id).in_(ids))).all():
            engine.patch_data(grant_ops(engine.data(), grant, now))
        return engine.data()

    def _evaluate(self, digest: str, modules: dict[str, str] | None, data: Mapping[str, Any] | None,
                  now: datetime) -> Any:
        """Version `digest`'s answer on the kept engine, on its own thread; `modules` (another version than
        the loaded one) and `data` (a rebuilt document) are loaded first; None: as loaded and patched."""
        if modules is not None:
            assert data is not None
            self._drop_engine()
            self._engine = scratch_engine(modules, data)
            self._engine_hash = digest
        elif data is not None:
            assert self._engine is not None
            self._engine.set_data(data)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tf-flowset")
        engine = self._engine
        assert engine is not None
        return self._worker.submit(engine.evaluate, ALLOWED_FLOWS_QUERY, {"now_ns": to_ns(now)}).result()

    def _drop_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._engine_hash = None
