"""The API's own outer layer: what every request meets before routing, in one pure-ASGI pass.

In order, as the five middlewares it replaces were stacked: the rate limit per client address (a flooding address
is refused 429 before anything else runs, counted and not logged: api/limits.py); the request's observation (its
request id, echoed in the answer; the access-log line, metrics and span once answered: api/observe.py); the body
limit (413 by Content-Length before anything reads the body, or when a streamed body passes it: core/asgi.py);
the console's security headers on /console answers (api/console/headers.py); and, after a write answered below
400, the enforcer's reconciler woken (api/enforcement.py).

Why one layer: each pure-ASGI layer costs a coroutine call per request and a wrapped `send` per message on the
event loop every request of a replica goes through (bench/asgi_layers.py: 3-5 us each, and the observation's
header dictionary ~10 us), for no behaviour the layering itself gave."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from api.console.headers import console_headers, set_headers
from api.enforcement import wakes_for
from api.limits import TokenBucket, refused_address
from api.observe import headers_of, record, request_id_of
from core.asgi import ASGIApp, Message, Receive, Scope, Send, budget_for

if TYPE_CHECKING:
    from api.tracing import Tracing


class Edge:
    """`rate`/`burst`: per client address (0: off); `max_body_bytes`, with `larger` limits by path; `tracing`:
    a server span per request (None: off); `wake(fabric=...)`: called after a write answered below 400."""

    def __init__(self, app: ASGIApp, *, rate: float, burst: int, max_body_bytes: int,
                 larger: dict[str, int] | None = None, tracing: Tracing | None = None,
                 wake: Callable[..., None] | None = None) -> None:
        self.app = app
        self.bucket = TokenBucket(rate, burst)
        self.max_body_bytes = max_body_bytes
        self.larger = dict(larger or {})
        self.tracing = tracing
        self.wake = wake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.bucket.rate > 0 and await refused_address(self.bucket, scope, send):
            return
        rid = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = rid
        status = 500
        start = time.perf_counter()
        rid_header = (b"x-request-id", rid.encode())

        async def observed(message: Message) -> None:  # every answer past the address limit, the 413s included
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = message.setdefault("headers", [])
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    message["headers"] = [*headers, rid_header]
            await send(message)

        span_cm: Any = self.tracing.server_span(scope["method"], headers_of(scope)) if self.tracing else None
        span = span_cm.__enter__() if span_cm is not None else None
        try:
            budget = await budget_for(scope, receive, observed, self.max_body_bytes, self.larger)
            if budget is None:  # refused by its Content-Length
                return
            console = console_headers(scope)
            app_status = 500

            async def sending(message: Message) -> None:
                nonlocal app_status
                if budget.refused:  # answered 413: what the app sends after is dropped
                    return
                if message["type"] == "http.response.start":
                    budget.started = True
                    app_status = int(message["status"])
                    if console is not None:
                        set_headers(message, console)
                await observed(message)

            await self.app(scope, budget.receive, sending)
            if self.wake is not None and app_status < 400:
                fabric = wakes_for(scope)
                if fabric is not None:
                    self.wake(fabric=fabric)
        finally:
            record(scope, rid, status, time.perf_counter() - start, span)
            if span_cm is not None:
                span_cm.__exit__(None, None, None)
