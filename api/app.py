"""The FastAPI application: composes the domain routers; holds no business logic."""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from api.authz import Authorizer, Evaluator, default_engine_factory
from api.background import server_jobs
from api.context import AppContext
from api.deps import Authenticator, opaque_token_authenticator
from api.errors import install_error_handlers
from api.limits import BodySizeLimit, TokenBucket
from api.readcache import ChangeWatch, ReadCache

log = logging.getLogger("trustfabric.api")

ROUTERS = (
    "api.routes.health",
    "api.routes.pki",
    "api.routes.audit",
    "api.routes.policy",
    "api.routes.inventory",
    "api.routes.grants",
    "api.routes.security",
    "api.routes.tokens",
    "api.routes.flows",
    "api.routes.grant_explain",
)


def _router_modules() -> list[Any]:
    modules = []
    for name in ROUTERS:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def default_authenticators(ctx: AppContext) -> list[Authenticator]:
    """Client certificate (mTLS), then opaque admin tokens, then JWTs (ours, OIDC, JWT-SVIDs)."""
    from api.auth_jwt import JwtAuthenticator
    from api.auth_mtls import MtlsAuthenticator

    return [MtlsAuthenticator(ctx), opaque_token_authenticator, JwtAuthenticator(ctx)]


def create_app(
    ctx: AppContext,
    *,
    authenticators: list[Authenticator] | None = None,
    authz_engine_factory: Any = default_engine_factory,
    grant_decider: Any = None,
    background: bool = False,
) -> FastAPI:
    """The API over `ctx`. `authz_engine_factory` returns the engine api_authz.rego is loaded in (None:
    every request is denied); `background` runs the periodic jobs (grant expiry, CA rotation, audit
    checkpoints) for the app's lifetime."""
    from api.grant_policy import RegoGrantDecider

    jobs = server_jobs(ctx) if background else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if jobs is not None:
            jobs.start()
        try:
            yield
        finally:
            if jobs is not None:
                jobs.stop()

    app = FastAPI(
        title="trustfabric",
        version="0.1.0",
        description="Zero-trust identity, policy and audit for a multi-tenant AI cloud.",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    app.state.authenticators = (
        authenticators if authenticators is not None else default_authenticators(ctx)
    )
    factory: Any = authz_engine_factory
    app.state.authorizer = Authorizer(factory if factory is not None else None)
    app.state.grant_decider = grant_decider if grant_decider is not None else RegoGrantDecider()
    app.state.rate_limiter = TokenBucket(ctx.settings.rate_limit_per_second, ctx.settings.rate_limit_burst)
    app.state.background = jobs
    app.state.grant_pages = ReadCache[bytes](ChangeWatch(ctx.db.engine, enabled=ctx.settings.read_cache))
    install_error_handlers(app)
    for module in _router_modules():
        app.include_router(module.router)
    from api.console import install_console

    install_console(app)  # the web console under /console: pages that call the routes above
    app.add_middleware(BodySizeLimit, max_bytes=ctx.settings.max_body_bytes)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (used by `trustfabric serve --workers N`)."""
    from api.config import Settings

    ctx = AppContext.open(Settings.from_env())
    return create_app(ctx, background=True)


__all__ = ["Evaluator", "create_app", "default_authenticators"]
