"""Authorization: every route asks `rego/api_authz.rego` (through the policy engine) whether the
principal's role may perform the action in the resource's tenant. Fail closed: no engine, an engine
error or an undefined answer is a deny, and the denial says why (the policy's reasons).

Tenant scope: the resource tenant passed here is the object's tenant (from the database or the
path), and the principal's tenant comes from its credential; the body never chooses either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import Request

from api.metrics import DECISIONS, EVALUATION, timed
from api.principal import Principal
from api.tracing import span
from core.errors import Forbidden
from policy.engines import EngineSettings, make_engine
from policy.shipped import authz_modules

log = logging.getLogger("trustfabric.api.authz")

AUTHZ_CACHE_SIZE = 4096


class Evaluator(Protocol):
    def evaluate(self, query: str, input: Any = None) -> Any: ...


class Authorizer:
    """Asks the policy engine; keeps its answers per (role, action, principal tenant, resource tenant) when
    `cache` is on (the `authz` cache of api/caches.py)."""

    def __init__(self, engine_factory: Callable[[], Evaluator] | None, *, cache: bool = True) -> None:
        self._factory = engine_factory
        self._use_cache = cache
        self._engine: Evaluator | None = None
        self._lock = threading.Lock()
        self._error: str | None = None
        self._cache: dict[tuple[str, str, str | None, str | None], tuple[bool, list[str]]] = {}

    def _get_engine(self) -> Evaluator | None:
        if self._engine is not None:
            return self._engine
        with self._lock:
            if self._engine is None and self._factory is not None:
                try:
                    self._engine = self._factory()
                    self._error = None
                except Exception as exc:  # fail closed; retried on the next request
                    log.exception("cannot load the API authorization policy")
                    self._error = f"{type(exc).__name__}: {exc}"
            return self._engine

    def decide(self, principal: Principal, action: str, tenant: str | None) -> tuple[bool, list[str]]:
        """(allowed, reasons) from api_authz.rego via policy.decide.authorize (which never raises)."""
        from policy.decide import authorize as policy_authorize

        key = (principal.role, action, principal.tenant, tenant)
        hit = self._cache.get(key)
        if hit is not None:
            DECISIONS.labels("authz", "allow" if hit[0] else "deny").inc()
            return hit
        engine = self._get_engine()
        if engine is None:
            return False, [f"authorization policy unavailable ({self._error or 'no engine configured'})"]
        with timed(EVALUATION, "authz"):
            decision = policy_authorize(
                engine,  # type: ignore[arg-type]
                {"id": principal.id, "role": principal.role, "tenant": principal.tenant},
                action,
                {"tenant": tenant} if tenant is not None else {},
            )
        DECISIONS.labels("authz", "allow" if decision.allow else "deny").inc()
        result = (True, decision.reasons) if decision.allow else (
            False, decision.reasons or ["default-deny: no rule allows this"])
        if self._use_cache and not any(r.startswith(("engine-error", "no-policy")) for r in decision.reasons):
            # The answer depends only on (role, action, principal tenant, resource tenant) and the
            # shipped policy, which does not change while the process runs; errors are never cached.
            if len(self._cache) >= AUTHZ_CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = result
        return result

    def require(self, principal: Principal, action: str, tenant: str | None) -> None:
        allowed, reasons = self.decide(principal, action, tenant)
        if not allowed:
            raise Forbidden(f"{principal.role} {principal.id} may not {action}: {'; '.join(reasons)}")


def default_engine_factory(settings: EngineSettings | None = None) -> Evaluator:
    """The engine configured for the `authz` role (embedded by default), loaded with the shipped
    `api_authz.rego`."""
    return make_engine(settings or EngineSettings(), "authz", authz_modules())


def authorize(request: Request, principal: Principal, action: str, tenant: str | None) -> None:
    """Raise Forbidden (with the policy's reasons) unless the policy allows the action."""
    authorizer: Authorizer | None = getattr(request.app.state, "authorizer", None)
    if authorizer is None:
        raise Forbidden(f"{principal.role} {principal.id} may not {action}: no authorization policy loaded")
    with span(getattr(request.app.state, "tracing", None), "policy.authorize", action=action):
        authorizer.require(principal, action, tenant)
