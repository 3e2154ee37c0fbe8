"""The web console: server-rendered pages under /console, each a client of the API routes (see client.py).

`install_console(app)` is the one hook in api/app.py: it mounts the pages (left out of the OpenAPI
document: they are HTML for people, not API), the vendored static files and the console's error pages (its
security headers are set by api/edge.py).
"""

from __future__ import annotations

import inspect
from functools import cache
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.staticfiles import StaticFiles

from api.console.client import ApiError
from api.console.session import PATH
from api.console.web import (
    CsrfRefused,
    NeedSignIn,
    on_api_error,
    on_csrf_refused,
    on_invalid_form,
    on_need_sign_in,
)
from api.inclusion import include_shared

STATIC = Path(__file__).resolve().parent / "static"


def page_routers() -> list[APIRouter]:
    """The router of every `pages_*` module, listed by name: a typo or a missing module is an ImportError
    when the app is built, never a page silently left out (tests/console checks every module is here)."""
    from api.console import pages_audit, pages_auth, pages_grants, pages_inventory, pages_platform, pages_policy

    return [m.router for m in (pages_audit, pages_auth, pages_grants, pages_inventory, pages_platform,
                               pages_policy)]


def console_routes() -> list[tuple[str, str]]:
    """(METHOD, path) of every console page: what the CSRF, header and isolation tests walk."""
    out: list[tuple[str, str]] = []
    for router in page_routers():
        for route in router.routes:
            if isinstance(route, APIRoute):
                out.extend((method, PATH + route.path) for method in sorted(route.methods or ()))
    return sorted(set(out))


@cache
def console_router() -> APIRouter:
    """Every page under /console: one router per process (api/inclusion.py shares its inclusion)."""
    router = APIRouter(prefix=PATH, include_in_schema=False)
    for pages in page_routers():
        router.include_router(pages)
    return router


def install_console(app: FastAPI) -> None:
    include_shared(app, console_router())
    app.mount(f"{PATH}/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(NeedSignIn, on_need_sign_in)
    app.add_exception_handler(CsrfRefused, on_csrf_refused)
    app.add_exception_handler(ApiError, on_api_error)
    api_invalid = app.exception_handlers[RequestValidationError]  # the API's JSON 422 (api/errors.py)

    async def on_invalid(request: Request, exc: Exception) -> Response:
        """One handler per exception class: a console path's bad form gets the console's page, the rest the API's."""
        path = request.url.path
        if isinstance(exc, RequestValidationError) and (path == PATH or path.startswith(PATH + "/")):
            return await on_invalid_form(request, exc)
        answer = api_invalid(request, exc)
        return await answer if inspect.isawaitable(answer) else answer

    app.add_exception_handler(RequestValidationError, on_invalid)
