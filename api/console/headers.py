"""Security headers on every console response (the API's JSON routes are left as they are).

The Content-Security-Policy allows scripts, styles, images and requests from this origin only: no inline
script or style, no eval, no framing, forms posting nowhere else. HTML pages are never cached (they show
one principal's data); the vendored static files may be.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Scope

from api.console.session import PATH

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}


def console_headers(scope: Scope) -> dict[str, str] | None:
    """The headers every answer on a /console path carries (None on any other path); api/edge.py sets them
    on the answer's start (streams pass through untouched)."""
    path = scope.get("path", "")
    if not (path == PATH or path.startswith(PATH + "/")):
        return None
    headers = dict(HEADERS)
    headers["cache-control"] = "public, max-age=3600" if path.startswith(PATH + "/static/") else "no-store"
    if scope.get("scheme") == "https":
        headers["strict-transport-security"] = "max-age=31536000"
    return headers


def set_headers(message: Message, headers: dict[str, str]) -> None:
    """Set `headers` on an http.response.start message, replacing any of the same name."""
    mutable = MutableHeaders(scope=message)
    for name, value in headers.items():
        mutable[name] = value
