"""Routers included once per process and shared by every app built in it.

FastAPI builds an included route's handler (its dependency tree and a pydantic validator per parameter) on the
first request through each inclusion: ~0.12-0.3 s of CPU for this API's 159 routes, paid again by every app a
process builds (the tests build one per test). The route modules' routers are module-level and never change
after import, and an inclusion holds nothing of an app: a request reaches its app's state through `request.app`.
So each router is included once, into a holder router, and every app appends the holder's (already built)
inclusion to its routes. What that gives up: FastAPI's `app.dependency_overrides`, which nothing here uses
(tests/api/test_inclusion.py checks both)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute

# id(router) -> (router, its inclusion): APIRouter is unhashable; the router is kept, so its id stays its own
_INCLUSIONS: dict[int, tuple[APIRouter, tuple[BaseRoute, ...]]] = {}


def include_shared(app: FastAPI, router: APIRouter) -> None:
    """`app.include_router(router)` with the inclusion made once per process (`router` must not change)."""
    app.router.routes.extend(_inclusion(router))


def _inclusion(router: APIRouter) -> tuple[BaseRoute, ...]:
    found = _INCLUSIONS.get(id(router))
    if found is None:
        holder = APIRouter()  # the defaults of a FastAPI app's own router, but for dependency_overrides
        holder.include_router(router)
        found = _INCLUSIONS.setdefault(id(router), (router, tuple(holder.routes)))
    return found[1]
