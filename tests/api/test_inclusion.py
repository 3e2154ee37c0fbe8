"""api/inclusion.py: every app a process builds shares one built inclusion of each route module's router, serves
exactly what `app.include_router` would have served, and answers from its own state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI

from api import docs
from api.app import ROUTERS
from api.console import console_router
from tests.api.conftest import make_settings, open_env, seeded_env


def test_two_apps_share_the_built_routes_and_each_answers_from_its_own_state(tmp_path: Path) -> None:
    bare = open_env(make_settings(tmp_path / "bare"))
    try:
        with seeded_env(tmp_path / "seeded") as seeded:
            shared = {id(r) for r in seeded.app.routes} & {id(r) for r in bare.app.routes}
            assert len(shared) >= len(ROUTERS) + 2  # the API's routers, the docs pages and the console
            assert sorted(t["slug"] for t in seeded.call("GET", "/v1/tenants", "admin").json()["items"]) == [
                "acme", "globex"]
            assert bare.call("GET", "/v1/tenants", "admin").json()["items"] == []
            for env in (seeded, bare):
                assert env.client.get("/console/").status_code in (200, 303)
                assert env.client.get("/docs").status_code == 200
    finally:
        bare.client.close()
        bare.ctx.close()


def test_the_shared_inclusion_serves_what_include_router_serves(tmp_path: Path) -> None:
    """The OpenAPI document and the (method, path) of every route equal those of an app that includes the same
    routers itself: the holder router's defaults are an app's."""
    env = open_env(make_settings(tmp_path / "home"))
    try:
        reference = FastAPI(title=env.app.title, version=env.app.version, description=env.app.description,
                            docs_url=None, redoc_url=None)
        for router in (*ROUTERS, docs.router, console_router()):
            reference.include_router(router)
        reference.openapi = lambda: docs.openapi_document(reference)  # type: ignore[method-assign]  # as installed
        assert env.app.openapi() == reference.openapi()

        def served(app: FastAPI) -> set[tuple[str, str]]:
            return {(m, p) for c in app.router.routes if hasattr(c, "effective_route_contexts")
                    for r in c.effective_route_contexts() for m in (r.methods or ()) for p in [r.path]}

        assert served(env.app) == served(reference) and len(served(reference)) > 100
    finally:
        env.client.close()
        env.ctx.close()


def test_the_prefix_gate_answers_as_the_inclusion_does(tmp_path: Path) -> None:
    """An inclusion gated by its routes' literal prefixes (api/inclusion.py) answers every path the API serves,
    each with every method, and paths it does not serve, exactly as the inclusion itself: the gate only ever
    says "no match" where the inclusion's own matching says it too."""
    import re

    from starlette.routing import BaseRoute, Match

    from api.inclusion import literal_prefixes

    env = open_env(make_settings(tmp_path / "home"))
    try:
        paths = [re.sub(r"\{[^}]*\}", "x1", p) for p in env.app.openapi()["paths"]]
        paths += [p + "/" for p in paths] + ["/", "/v1", "/v1/", "/v1/nothing-here", "/console/", "/docs", "/v2/grants"]
        gated = [r for r in env.app.router.routes if hasattr(r, "tf_prefixes")]
        assert len(gated) >= len(ROUTERS) - 1 and all(literal_prefixes(r) for r in ROUTERS if r is not None)
        compared = matched = 0
        for route in gated:
            inner = type(route).__mro__[1]  # the inclusion's own class, ungated
            assert issubclass(inner, BaseRoute), inner
            for path in paths:
                for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "root_path": "",
                                             "headers": [], "app": env.app}
                    gate = route.matches(dict(scope))[0]
                    assert gate == inner.matches(route, dict(scope))[0], (path, method, route)
                    compared += 1
                    matched += gate != Match.NONE
        assert compared > 1000 and matched > 100  # both answers were seen, many times
    finally:
        env.client.close()
        env.ctx.close()
