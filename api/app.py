"""The FastAPI application: composes the domain routers; holds no business logic."""

from __future__ import annotations

import importlib
from typing import Any

from fastapi import FastAPI

from api.context import AppContext
from api.deps import Authenticator, opaque_token_authenticator
from api.errors import install_error_handlers

ROUTERS = (
    "api.routes.health",
    "api.routes.pki",
    "api.routes.audit",
    "api.routes.policy",
    "api.routes.inventory",
    "api.routes.grants",
    "api.routes.security",
    "api.routes.tokens",
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


def create_app(ctx: AppContext, *, authenticators: list[Authenticator] | None = None) -> FastAPI:
    app = FastAPI(
        title="trustfabric",
        version="0.1.0",
        description="Zero-trust identity, policy and audit for a multi-tenant AI cloud.",
    )
    app.state.ctx = ctx
    app.state.authenticators = authenticators or [opaque_token_authenticator]
    install_error_handlers(app)
    for module in _router_modules():
        app.include_router(module.router)
    return app
