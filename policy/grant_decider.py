"""The grant decider the API hands to policy.grants (here, beside the service it serves, so no HTTP layer is
needed to decide a grant): `data.grants.decision` of the ACTIVE policy version
(what the security team uploaded, tested, reviewed the impact of and activated), through the embedded
policy engine, on the data document of the same session (so the decision sees exactly what will be
written).

The document is rebuilt only when it would differ: one statement in the request's own transaction reads
every row build_data reads (policy.data.data_fingerprint); while that fingerprint is the one the kept
document was built from, and no grant in it has expired since, the kept document is the one build_data
would return, and the engine already holds it (no rebuild, no diff). A change committed by any connection
or process changes the fingerprint, so it is seen by the next decision. A document is kept only when it
and its fingerprint were read in one snapshot (SQLite's transactions; a REPEATABLE READ or SERIALIZABLE
transaction on PostgreSQL, as explain opens), so a kept pair is always exact.

Explain (`decide_flow`) answers on the same engine and kept document: as cheap as a grant decision, never
a new engine or a rebuilt document per call (issue 13, item 6: one tenant looping explain must not slow the
others down).

Fail closed: no active version, or an active version without `data.grants.decision`, denies the
request with a `no-policy:` reason (policy.decide logs it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection
from sqlmodel import Session, col, select

from policy.decide import FlowDecision
from policy.engines import EngineSettings, PolicyEngine, make_engine
from policy.errors import PolicyEngineError
from policy.grants import GrantDecision
from policy.models import PolicyVersion


@dataclass(frozen=True)
class _Kept:
    fingerprint: tuple[Any, ...]
    built_at_ns: int
    valid_until_ns: int | None
    data: dict[str, Any]


class RegoGrantDecider:
    """Callable (session, now, input) -> GrantDecision; any engine failure propagates and the grant
    service turns it into a denial with the reason (fail closed)."""

    def __init__(self, *, keep_data: bool = True, engine_factory: Callable[[], PolicyEngine] | None = None) -> None:
        """`engine_factory`: the engine for the active version (policy.engines.make_engine's choice for the
        `grants` role; the embedded engine when None)."""
        self._factory = engine_factory or (lambda: make_engine(EngineSettings(), "grants"))
        self._engine: PolicyEngine | None = None
        self._hash: str | None = None
        self._lock = threading.Lock()
        self._keep_data = keep_data
        self._kept: _Kept | None = None
        self._held: Any = None  # the document object the engine was last brought up to (see _bring_up)
        self.rebuilds = 0  # documents built by build_data (for tests and profiling)

    def _state(self, session: Session) -> tuple[tuple[Any, ...] | None, str | None]:
        """(the policy data fingerprint, or None when documents are not kept; the active version's hash), read
        in one statement: what each decision checks before it may answer on the kept engine and document."""
        from policy.data import fingerprint_and_active

        state = fingerprint_and_active(session)
        if state is None:  # a database without the data version row: nothing can be kept
            digest = session.exec(
                select(PolicyVersion.content_hash).where(col(PolicyVersion.state) == "active")
            ).first()
            return None, digest
        fingerprint, digest = state
        return (fingerprint if self._keep_data else None), digest

    def _engine_for(self, session: Session, digest: str | None) -> PolicyEngine:
        """The engine loaded with the active version's modules (`digest`; reloaded when another version is
        activated); an empty engine (every decision: no-policy) when none is active. Call with the lock held.

        Its *_test.rego modules stay out: they are the version's tests (`trustfabric policy test` runs them), no
        decision reads them, and a regorus engine prepares every rule it holds, on its first evaluation and again
        on its first after each change of the data: with the shipped tests loaded, 3.6 ms instead of 0.7 ms
        after a change (each worker thread pays it once per change)."""
        from policy.testing import is_test_module

        if self._engine is None:
            self._engine = self._factory()
        if digest != self._hash:
            modules: dict[str, str] = {}
            if digest is not None:
                row = session.exec(select(PolicyVersion).where(col(PolicyVersion.content_hash) == digest)).one()
                modules = {path: text for path, text in row.modules.items() if not is_test_module(path)}
            self._engine.load(modules)
            self._hash = digest
        return self._engine

    def _data(self, session: Session, now: datetime, fingerprint: tuple[Any, ...] | None) -> dict[str, Any]:
        """build_data(session, now), or the kept document when `fingerprint` (the session's) proves it the same."""
        from policy.data import build_data, live_until, to_ns

        now_ns = to_ns(now)
        if fingerprint is not None:
            with self._lock:
                kept = self._kept
            if (
                kept is not None and kept.fingerprint == fingerprint and kept.built_at_ns <= now_ns
                and (kept.valid_until_ns is None or now_ns < kept.valid_until_ns)
            ):
                return kept.data
        if fingerprint is not None and not _one_snapshot(session):
            # PostgreSQL, READ COMMITTED (a write request): build in a REPEATABLE READ transaction of its own,
            # whose document and fingerprint are one snapshot; it is this request's document when both
            # fingerprints agree (same committed state, and no change of this request's own under the
            # document yet: its trigger bumps show in its own fingerprint only)
            data, side = _snapshot_build(session, now)
            self.rebuilds += 1
            if side == fingerprint:
                with self._lock:
                    self._kept = _Kept(fingerprint, now_ns, live_until(data), data)
                return data
        data = build_data(session, now)
        self.rebuilds += 1
        if fingerprint is not None and _one_snapshot(session):
            with self._lock:
                self._kept = _Kept(fingerprint, now_ns, live_until(data), data)
        return data

    @property
    def engine(self) -> PolicyEngine | None:
        """The engine decisions are made on; None before the first (for tests and profiling)."""
        return self._engine

    def warm(self, session: Session, now: datetime) -> None:
        """Bring this thread's engine up to the active version and document without deciding anything: a worker
        thread warmed as a server starts (api/workers.py) builds nothing on its first decision, where a build
        holds every other decision of the process (this lock) for 10-50 ms. Fails as a decision would fail."""
        from policy.decide import FLOW_QUERY, GRANT_QUERY

        fingerprint, digest = self._state(session)
        data = self._data(session, now, fingerprint)
        with self._lock:
            engine = self._engine_for(session, digest)
            if not self._bring_up(engine, data):
                return
            engine.warm()
            # a regorus engine prepares every rule it holds on its first evaluation (several ms; well under one after):
            # once per thread, here, not on a request's time
            for query in (GRANT_QUERY, FLOW_QUERY):
                with contextlib.suppress(PolicyEngineError):  # an empty input may be refused: nothing to keep
                    engine.evaluate(query, {})

    def decide_flow(self, session: Session, now: datetime, flow: dict[str, Any]) -> tuple[FlowDecision, str | None]:
        """(the FlowDecision on one flow under the active version, that version's hash): explain, on the same
        engine and kept document as grant decisions instead of a fresh engine and document per call."""
        from policy.decide import decide_flow

        fingerprint, digest = self._state(session)
        data = self._data(session, now, fingerprint)
        with self._lock:
            engine = self._engine_for(session, digest)
            if not self._bring_up(engine, data):
                return decide_flow(engine, flow, data), self._hash  # fails closed with the reason
            return decide_flow(engine, flow, None), self._hash

    def __call__(self, session: Session, now: datetime, request: dict[str, Any]) -> GrantDecision:
        from policy.decide import decide_grant_request

        fingerprint, digest = self._state(session)
        data = self._data(session, now, fingerprint)
        with self._lock:  # the engine's modules and data must be this request's while it decides
            engine = self._engine_for(session, digest)
            decision = decide_grant_request(engine, None if self._bring_up(engine, data) else data, request)
            digest = self._hash
        return GrantDecision(decision.outcome, list(decision.approvers), list(decision.reasons), digest)

    def _bring_up(self, engine: PolicyEngine, data: dict[str, Any]) -> bool:
        """Make the engine hold `data`; False when that failed (the caller's decision then fails closed with the
        reason). Call with the lock held. Free when the engine already holds this very object (the kept
        document): comparing the engine's own copy with an equal but distinct document walks all of it, which
        at 500 large groups cost more than the decision (issue 13, item 6), and an engine's copy never becomes
        the caller's object (set_data copies, a patch builds a new document)."""
        from policy.decide import sync_data

        if data is self._held:
            return True
        self._held = None
        try:
            sync_data(engine, data)
        except Exception:
            return False
        self._held = data
        return True


def _snapshot_build(session: Session, now: datetime) -> tuple[dict[str, Any], tuple[Any, ...] | None]:
    """(build_data, data_fingerprint) read in one REPEATABLE READ transaction beside the session's."""
    from policy.data import build_data, data_fingerprint

    bind = session.get_bind()
    # its own connection: the session's may be one shared by a request's reads (store.db's one_connection), which a
    # REPEATABLE READ transaction must not be left on
    with Session(bind.engine if isinstance(bind, Connection) else bind, expire_on_commit=False) as side:
        side.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        fingerprint = data_fingerprint(side)
        return build_data(side, now), fingerprint


def _one_snapshot(session: Session) -> bool:
    """Whether every statement of the session's transaction reads one snapshot of the database."""
    if session.get_bind().dialect.name == "sqlite":
        return True
    conn = session.connection()
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        # no transaction (store.db's read_session(statements=True)): each statement its own snapshot, whatever
        # level the server would report (its default_transaction_isolation, which is not this)
        return False
    level = str(conn.get_isolation_level()).upper()
    return level in ("REPEATABLE READ", "SERIALIZABLE")
