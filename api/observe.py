"""What the API tells its operators about each request (run by api/edge.py, the one outermost layer of ours):
a request id (the caller's sane X-Request-ID, else a new one; echoed in the answer and written into audit
events), one access-log line (route template, never the raw path or query; principal, status, latency), the
request metrics, and a server span when tracing is on. The authorization header and bodies are never logged."""

from __future__ import annotations

import logging
import re
import secrets
from typing import TYPE_CHECKING, Any

from api.metrics import LATENCY, REQUESTS

if TYPE_CHECKING:
    from core.asgi import Scope

access = logging.getLogger("trustfabric.access")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
QUIET = frozenset({"/healthz", "/metrics"})  # scraped often: logged at debug


def route_of(scope: Scope) -> str:
    """The template of the route that matched (`/v1/grants/{grant_id}`), or `<unmatched>`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "<unmatched>"


def request_id_of(scope: Scope) -> str:
    """The caller's X-Request-ID when it is sane (the last one given), else a fresh one."""
    given = None
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = value.decode("latin-1")
    return given if given and _REQUEST_ID_RE.fullmatch(given) else secrets.token_hex(8)


def headers_of(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of a repeated one), for a span's trace context."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def record(scope: Scope, rid: str, status: int, elapsed: float, span: Any) -> None:
    """The request's metrics, access-log line and span attributes, once it is answered (or failed)."""
    route = route_of(scope)
    method = scope["method"]
    principal = scope.get("state", {}).get("principal")
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
            if principal.tenant is not None:  # the id alone names no one: acme's and globex's `alice` are one id
                span.set_attribute("trustfabric.tenant", principal.tenant)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))
    access.log(
        logging.DEBUG if route in QUIET else logging.INFO, "%s %s %d", method, route, status,
        extra={"request_id": rid, "method": method, "route": route, "status": status,
               "latency_ms": round(elapsed * 1000, 3),
               "principal": principal.id if principal is not None else None,
               "role": principal.role if principal is not None else None,
               "tenant": principal.tenant if principal is not None else None},
    )
