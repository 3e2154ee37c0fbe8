"""What the API tells its operators about each request, in one outermost ASGI middleware: a request id (the
caller's sane X-Request-ID, else a new one; echoed in the answer and written into audit events), one
access-log line (route template, never the raw path or query; principal, status, latency), the request
metrics, and a server span when tracing is on. The authorization header and bodies are never logged."""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import TYPE_CHECKING, Any

from api.metrics import LATENCY, REQUESTS

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from api.tracing import Tracing

access = logging.getLogger("trustfabric.access")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
QUIET = frozenset({"/healthz", "/metrics"})  # scraped often: logged at debug


def route_of(scope: Scope) -> str:
    """The template of the route that matched (`/v1/grants/{grant_id}`), or `<unmatched>`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "<unmatched>"


class Observe:
    def __init__(self, app: ASGIApp, tracing: Tracing | None = None) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id")
        rid = given if given and _REQUEST_ID_RE.fullmatch(given) else secrets.token_hex(8)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        status = 500
        start = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message.setdefault("headers", [])
                if not any(k.lower() == b"x-request-id" for k, _ in message["headers"]):
                    message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        span_cm: Any = self.tracing.server_span(scope["method"], headers) if self.tracing else None
        span = span_cm.__enter__() if span_cm is not None else None
        try:
            await self.app(scope, receive, sending)
        finally:
            elapsed = time.perf_counter() - start
            route = route_of(scope)
            method = scope["method"]
            principal = state.get("principal")
            REQUESTS.labels(method, route, str(status)).inc()
            LATENCY.labels(method, route).observe(elapsed)
            if span is not None:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.request.method", method)
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                span.set_attribute("trustfabric.request_id", rid)
                if principal is not None:
                    span.set_attribute("enduser.id", principal.id)
                    span.set_attribute("enduser.role", principal.role)
                if status >= 500:
                    from opentelemetry.trace import Status, StatusCode

                    span.set_status(Status(StatusCode.ERROR))
                span_cm.__exit__(None, None, None)
            access.log(
                logging.DEBUG if route in QUIET else logging.INFO, "%s %s %d", method, route, status,
                extra={"request_id": rid, "method": method, "route": route, "status": status,
                       "latency_ms": round(elapsed * 1000, 3),
                       "principal": principal.id if principal is not None else None,
                       "role": principal.role if principal is not None else None},
            )
