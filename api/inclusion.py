"""Routers included once per process and shared by every app built in it.

FastAPI builds an included route's handler (its dependency tree and a pydantic validator per parameter) on the
first request through each inclusion: ~0.12-0.3 s of CPU for this API's 159 routes, paid again by every app a
process builds (the tests build one per test). The route modules' routers are module-level and never change
after import, and an inclusion holds nothing of an app: a request reaches its app's state through `request.app`.
So each router is included once, into a holder router, and every app appends the holder's (already built)
inclusion to its routes. What that gives up: FastAPI's `app.dependency_overrides`, which nothing here uses
(tests/api/test_inclusion.py checks both).

Each inclusion is also gated by its routes' literal path prefixes (a route's path up to its first parameter):
the app asks every inclusion in turn whether it matches a request, and an inclusion answers by trying each of
its routes' patterns, so a request for the 12th router's route paid ~85 us of matching on the event loop
(/v1/grants, the 6th, ~45 us). A path that starts with none of an inclusion's prefixes can match none of its
routes (a route's pattern is its literal prefix followed by the parameters' patterns), so the gate answers "no
match" at once and any other answer is the inclusion's own."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

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
        prefixes = literal_prefixes(router)
        routes = tuple(_gate(route, prefixes) for route in holder.routes) if prefixes else tuple(holder.routes)
        found = _INCLUSIONS.setdefault(id(router), (router, routes))
    return found[1]


def literal_prefixes(router: APIRouter) -> tuple[str, ...] | None:
    """The literal start of every route's path (up to its first parameter); None when a route does not match as
    an APIRoute does (a mount, a nested router, a route class with matching of its own), whose matching the gate
    does not reason about. A route class that changes only how its endpoint runs (api/handoff.py) is gated."""
    prefixes: set[str] = set()
    for route in router.routes:
        if not isinstance(route, APIRoute) or type(route).matches is not APIRoute.matches:
            return None
        prefixes.add(route.path.split("{", 1)[0])
    return tuple(sorted(prefixes)) or None


_GATED: dict[type, type] = {}  # an inclusion's class -> its gated subclass


def _gate(route: BaseRoute, prefixes: tuple[str, ...]) -> BaseRoute:
    """`route` (an inclusion FastAPI built) answering "no match" at once for a path outside `prefixes`. Its class
    becomes a subclass of its own, so FastAPI's checks of the inclusion's type hold as before."""
    base = type(route)
    gated = _GATED.get(base)
    if gated is None:
        gated = _GATED.setdefault(base, type(f"Gated{base.__name__}", (base,), {"matches": _gated_matches}))
    route.__class__ = gated
    route.tf_prefixes = prefixes  # type: ignore[attr-defined]
    return route


def _gated_matches(self: Any, scope: Scope) -> tuple[Match, Scope]:
    if not get_route_path(scope).startswith(self.tf_prefixes):
        return Match.NONE, {}
    return super(type(self), self).matches(scope)  # type: ignore[no-any-return]
