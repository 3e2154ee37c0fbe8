"""/docs (Swagger UI) and /redoc (ReDoc) served from the package: the assets are vendored under
api/static/docs (versions and checksums in VERSIONS.txt), so the pages work on a host without internet.
FastAPI's own pages load them from a CDN and stay blank air-gapped; they are switched off in api/app.py.

Both pages carry a Content-Security-Policy that lets the browser load nothing from any other host: ReDoc's
bundle shows a logo from its vendor's CDN in the menu footer (hidden when it cannot load); the policy stops
that request before it is made.

`/` itself says where things are: a browser is sent to the console, any other client gets a small JSON index.
The OpenAPI document declares how a caller authenticates (`openapi_document`), for the pages' Authorize button."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.staticfiles import StaticFiles

from api.deps import AUTHENTICATED_IN_THREAD, current_principal
from api.inclusion import include_shared

STATIC = Path(__file__).resolve().parent / "static" / "docs"
PREFIX = "/static/docs"

CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
       "frame-ancestors 'none'")

router = APIRouter(include_in_schema=False)


def _this_host_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    return page


INDEX: dict[str, str] = {"api": "/v1", "docs": "/docs", "openapi": "/openapi.json", "console": "/console/"}


@router.get("/")
def index(request: Request) -> Response:
    """Where things are. A browser (it asks for HTML) is sent on to the console (303: see other, GET); any other
    client (curl, a script) gets the small index as JSON, so `curl https://host/` tells an operator where to go."""
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(INDEX["console"], status_code=303)
    return JSONResponse(INDEX)


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return _this_host_only(get_swagger_ui_html(
        openapi_url="/openapi.json", title="trustfabric API",
        swagger_js_url=f"{PREFIX}/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url=f"{PREFIX}/swagger-ui/swagger-ui.css",
        swagger_favicon_url=f"{PREFIX}/swagger-ui/favicon-32x32.png",
    ))


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return _this_host_only(get_redoc_html(
        openapi_url="/openapi.json", title="trustfabric API", redoc_js_url=f"{PREFIX}/redoc/redoc.standalone.js",
        redoc_favicon_url=f"{PREFIX}/swagger-ui/favicon-32x32.png", with_google_fonts=False))


# How a caller authenticates (api/auth/): declared in the OpenAPI document so /docs has an Authorize button and
# "Try it out" sends the token. Documentation only: enforcement stays with api/deps.py's authenticators.
SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "bearer": {
        "type": "http", "scheme": "bearer",
        "description": "An API token (`trustfabric token create`, or the admin bootstrap token), an OIDC access "
                       "token of the configured issuer, or a JWT-SVID: `Authorization: Bearer <token>`.",
    },
    "mtls": {
        "type": "mutualTLS",
        "description": "A node's or a workload's X.509-SVID as the TLS client certificate (the device API, node "
                       "renewal, workloads): tried before a bearer token. Not something a browser's Try it out "
                       "sends; use curl --cert/--key.",
    },
}
# Either one authenticates (api/auth/__init__.py tries the client certificate, then a bearer token).
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"mtls": []}]


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dep in dependant.dependencies:
        yield dep
        yield from _dependencies(dep)


def requires_principal(route: APIRoute) -> bool:
    """Whether the route authenticates its caller: it takes the principal as a dependency (directly, or through
    `require_roles`), or authenticates in its own hand-off (api/handoff.py: its principal is off its signature)."""
    if route.endpoint in AUTHENTICATED_IN_THREAD:
        return True
    return any(dep.call is current_principal for dep in _dependencies(route.dependant))


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with the security schemes declared and every operation that authenticates its caller
    marked with them; a public operation (health, the trust bundle, the CRL, node attestation by join token)
    carries none. Built once, as FastAPI's own is."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = FastAPI.openapi(app)  # FastAPI's (kept on the app as app.openapi_schema: marked once, here)
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    paths = document.get("paths", {})
    for context in iter_route_contexts(app.routes):  # through the inclusions (api/inclusion.py), as FastAPI's
        route = context.original_route
        if not isinstance(route, APIRoute) or not route.include_in_schema or not requires_principal(route):
            continue
        operations = paths.get(context.path_format, {})
        for method in context.methods or ():
            operation = operations.get(method.lower())
            if operation is not None:
                operation["security"] = SECURITY
    return document


def install(app: FastAPI) -> None:
    """Mount the pages and their assets on `app` (created with docs_url=None, redoc_url=None), and have its
    OpenAPI document say how to authenticate."""
    include_shared(app, router)
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="docs-static")
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
