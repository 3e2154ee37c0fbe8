"""The grant decider the API hands to policy.grants: `data.grants.decision` of the ACTIVE policy version
(what the security team uploaded, tested, reviewed the impact of and activated), through the embedded
policy engine, on the data document built from the same session (so the decision sees exactly what
will be written).

Fail closed: no active version, or an active version without `data.grants.decision`, denies the
request with a `no-policy:` reason (policy.decide logs it).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from policy.grants import GrantDecision
from policy.models import PolicyVersion


class RegoGrantDecider:
    """Callable (session, now, input) -> GrantDecision; any engine failure propagates and the grant
    service turns it into a denial with the reason (fail closed)."""

    def __init__(self) -> None:
        self._engine: Any = None
        self._hash: str | None = None
        self._lock = threading.Lock()

    def _engine_for(self, session: Session) -> Any:
        """The engine loaded with the active version's modules (reloaded when another version is activated);
        an empty engine (every decision: no-policy) when none is active. Call with the lock held."""
        from policy.engine_regorus import RegorusEngine

        digest = session.exec(
            select(PolicyVersion.content_hash).where(col(PolicyVersion.state) == "active")
        ).first()
        if self._engine is None:
            self._engine = RegorusEngine()
        if digest != self._hash:
            modules: dict[str, str] = {}
            if digest is not None:
                row = session.exec(select(PolicyVersion).where(col(PolicyVersion.content_hash) == digest)).one()
                modules = dict(row.modules)
            self._engine.load(modules)
            self._hash = digest
        return self._engine

    def __call__(self, session: Session, now: datetime, request: dict[str, Any]) -> GrantDecision:
        from policy.data import build_data
        from policy.decide import decide_grant_request

        data = build_data(session, now)
        with self._lock:  # the engine's modules and data must be this request's while it decides
            decision = decide_grant_request(self._engine_for(session), data, request)
            digest = self._hash
        return GrantDecision(decision.outcome, list(decision.approvers), list(decision.reasons), digest)
