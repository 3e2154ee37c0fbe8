"""The grant decider the API hands to policy.grants: grants.rego through the embedded policy engine,
on the data document built from the same session (so the decision sees exactly what will be written)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from sqlmodel import Session

from api.authz import REGO_DIR
from policy.grants import GrantDecision

GRANTS_MODULE = "grants.rego"


class RegoGrantDecider:
    """Callable (session, now, input) -> GrantDecision; any engine failure propagates and the grant
    service turns it into a denial with the reason (fail closed)."""

    def __init__(self) -> None:
        self._engine: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._engine is None:
            from policy.engine_regorus import RegorusEngine

            text = (REGO_DIR / GRANTS_MODULE).read_text(encoding="utf-8")
            self._engine = RegorusEngine({GRANTS_MODULE: text})
        return self._engine

    def __call__(self, session: Session, now: datetime, request: dict[str, Any]) -> GrantDecision:
        from policy.data import build_data
        from policy.decide import decide_grant_request

        data = build_data(session, now)
        with self._lock:  # the engine's data must be this request's data while it decides
            decision = decide_grant_request(self._get(), data, request)
        return GrantDecision(decision.outcome, list(decision.approvers), list(decision.reasons))
