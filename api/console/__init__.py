"""The web console: server-rendered pages under /console, each a client of the API routes (see client.py).

`install_console(app)` is the one hook in api/app.py: it mounts the pages (left out of the OpenAPI
document: they are HTML for people, not API), the vendored static files, the console's error pages and
its security headers.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.staticfiles import StaticFiles

from api.console.client import ApiError
from api.console.headers import ConsoleHeaders
from api.console.session import PATH
from api.console.web import CsrfRefused, NeedSignIn, on_api_error, on_csrf_refused, on_need_sign_in

STATIC = Path(__file__).resolve().parent / "static"


def console_router() -> APIRouter:
    from api.console import pages_audit, pages_auth, pages_grants, pages_inventory, pages_policy

    router = APIRouter(prefix=PATH, include_in_schema=False)
    for module in (pages_auth, pages_inventory, pages_grants, pages_policy, pages_audit):
        router.include_router(module.router)
    return router


def install_console(app: FastAPI) -> None:
    app.include_router(console_router())
    app.mount(f"{PATH}/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(NeedSignIn, on_need_sign_in)
    app.add_exception_handler(CsrfRefused, on_csrf_refused)
    app.add_exception_handler(ApiError, on_api_error)
    app.add_middleware(ConsoleHeaders)
