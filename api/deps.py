"""FastAPI dependencies: the app context and the authenticated principal.

Authentication is a list of authenticators (api/auth/) tried in order; each returns None when its kind of
credential is absent and raises Unauthenticated when it is present but bad.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from api.auth import Authenticator
from api.limits import EvaluationSlots
from api.principal import Principal
from core.errors import Forbidden, Unauthenticated
from workflows.context import AppContext

E = TypeVar("E", bound=Callable[..., Any])


async def get_ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def current_principal(request: Request, ctx: Annotated[AppContext, Depends(get_ctx)]) -> Principal:
    """The authenticated caller, as a dependency (`PrincipalDep`). Resolved by FastAPI on the event loop only
    for an `async def` route (and `require_roles`): a `def` route taking it is run by its route class
    (api/handoff.py) as one hand-off that authenticates in the worker thread, so the token row's read is not
    made on the loop."""
    return authenticate(request, ctx)


AUTHENTICATED_IN_THREAD: set[Callable[..., Any]] = set()  # endpoints calling `authenticate` in their hand-off


def authenticated_in_thread(endpoint: E) -> E:
    """Marks a route that authenticates in its own hand-off to a worker thread (after FastAPI validated its
    parameters on the loop): a request it refuses as invalid is authenticated first (api/errors.py), so an
    unauthenticated one is answered 401, as by the routes that authenticate as a dependency, never 422."""
    AUTHENTICATED_IN_THREAD.add(endpoint)
    return endpoint


def rate_key(principal: Principal) -> str:
    """The principal's rate-limit bucket: its role and qualified id, never another tenant's namesake's."""
    return f"{principal.role} {principal.qualified_id}"


def unauthenticated(request: Request) -> None:
    """Forget the principal `authenticate` took from a token whose deferred check then failed (api/handoff.py):
    the access log names no one, and the rate-limit token charged to that principal goes back, so a revoked
    token's requests never drain the bucket of the principal it names."""
    principal: Principal | None = getattr(request.state, "principal", None)
    request.state.principal = None
    limiter = getattr(request.app.state, "rate_limiter", None)
    if principal is not None and limiter is not None:
        limiter.give_back(rate_key(principal), 1 + getattr(request.state, "rate_extra", 0))
    request.state.rate_extra = 0


def charge_entries(request: Request, principal: Principal, entries: int, what: str) -> None:
    """Charge the principal's rate limit one token per entry of a batch (SPIRE counts its signing rate limit per
    CSR): the request took one already (`authenticate`), this takes the other entries - 1, all or none, before the
    route does any work. RateLimited (429, Retry-After: until all `entries` are there; nothing more taken, and the
    request's own token goes back) or BatchAboveBurst (422: more than the burst, never passes). Recorded on the
    request, so a token whose deferred check then fails gives them all back (`unauthenticated`)."""
    limiter = getattr(request.app.state, "rate_limiter", None)
    if limiter is None or entries <= 1:
        return
    limiter.check_more(rate_key(principal), entries - 1, what)
    request.state.rate_extra = getattr(request.state, "rate_extra", 0) + entries - 1


def authenticate(request: Request, ctx: AppContext) -> Principal:
    """The authenticated caller (kept on the request: asked again, the same one), refused by the principal's
    rate limit; Unauthenticated with the reason otherwise. Reads the database (the token's row): call it on
    the event loop only where the loop may wait for it."""
    cached: Principal | None = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    authenticators: list[Authenticator] = request.app.state.authenticators
    for authenticator in authenticators:
        principal = authenticator(ctx, request)
        if principal is not None:
            limiter = getattr(request.app.state, "rate_limiter", None)
            if limiter is not None:
                limiter.check(rate_key(principal))
            request.state.principal = principal
            return principal
    if request.headers.get("authorization"):
        raise Unauthenticated("invalid bearer token")
    raise Unauthenticated("authentication required: send 'Authorization: Bearer <token>'")


def evaluation_slot(request: Request, principal: Principal) -> AbstractContextManager[None]:
    """One of the caller's policy evaluation slots (api.limits.EvaluationSlots) for the block: its tenant's
    share for a tenant principal (however many tokens the tenant holds), its own for a platform one."""
    slots: EvaluationSlots | None = getattr(request.app.state, "evaluation_slots", None)
    if slots is None:
        return nullcontext()
    tenant = principal.scope_tenant
    if tenant is not None:
        return slots.hold(f"tenant:{tenant}", f"tenant {tenant}")
    return slots.hold(f"principal:{principal.id}", f"principal {principal.id}")


def require_roles(*roles: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits only the given roles (403 otherwise)."""

    async def _dep(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if principal.role not in roles:
            raise Forbidden(f"role {principal.role!r} may not do this (needs one of: {', '.join(roles)})")
        return principal

    return _dep


CtxDep = Annotated[AppContext, Depends(get_ctx)]
PrincipalDep = Annotated[Principal, Depends(current_principal)]
