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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from policy.data import build_data, data_fingerprint, live_until, to_ns
from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engines import scratch_engine
from policy.matrix import Pair, pair_counts
from policy.service import active_version
from store.db import Database


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
        self.evaluations = 0  # for tests and the benchmark

    def _unchanged(self, version: int | None, now: datetime) -> FlowSet | None:
        kept = self._kept
        if kept is not None and version is not None and kept.change_version == version and kept.fresh_at(now):
            return kept
        return None

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
            kept = self._kept
            with self._db.read_session() as session:
                if self._db.dialect == "postgresql":  # the version and the data from one snapshot
                    session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                fingerprint = data_fingerprint(session) if self._keep else None
                active = active_version(session)
                digest = active.content_hash if active is not None else None
                if (kept is not None and fingerprint is not None and kept.fingerprint == fingerprint
                        and kept.policy_hash == digest and kept.fresh_at(now)):
                    self._kept = replace(kept, change_version=version)
                    return self._kept
                data = build_data(session, now)
                modules = dict(active.modules) if active is not None else None
            raw: Any = []  # no active version: every flow is denied
            if modules is not None:
                engine = scratch_engine(modules, data)
                try:
                    raw = engine.evaluate(ALLOWED_FLOWS_QUERY, {"now_ns": to_ns(now)})
                finally:
                    engine.close()
            counts = pair_counts(raw)  # InvalidInput for anything but a list of well-formed entries
            self.evaluations += 1
            flows = FlowSet(digest, now, raw, counts, version, fingerprint, live_until(data))
            if self._keep:
                self._kept = flows
            return flows
