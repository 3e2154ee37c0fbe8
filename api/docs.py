"""/docs (Swagger UI) and /redoc (ReDoc) served from the package: the assets are vendored under
api/static/docs (versions and checksums in VERSIONS.txt), so the pages work on a host without internet.
FastAPI's own pages load them from a CDN and stay blank air-gapped; they are switched off in api/app.py.

Both pages carry a Content-Security-Policy that lets the browser load nothing from any other host: ReDoc's
bundle shows a logo from its vendor's CDN in the menu footer (hidden when it cannot load); the policy stops
that request before it is made."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

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


def install(app: FastAPI) -> None:
    """Mount the pages and their assets on `app` (created with docs_url=None, redoc_url=None)."""
    include_shared(app, router)
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="docs-static")
