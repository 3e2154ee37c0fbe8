"""Security headers on every console response (the API's JSON routes are left as they are).

The Content-Security-Policy allows scripts, styles, images and requests from this origin only: no inline
script or style, no eval, no framing, forms posting nowhere else. HTML pages are never cached (they show
one principal's data); the vendored static files may be.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class ConsoleHeaders:
    """Pure ASGI middleware (streams pass through untouched), active on /console paths only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PATH or path.startswith(PATH + "/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith(PATH + "/static/")
        tls = scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
                headers["cache-control"] = "public, max-age=3600" if static else "no-store"
                if tls:
                    headers["strict-transport-security"] = "max-age=31536000"
            await send(message)

        await self.app(scope, receive, send_with_headers)
