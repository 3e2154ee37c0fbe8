"""A pure-ASGI request body limit, shared by the API and the PDP (both mount it; neither imports the other).

No framework import: it refuses by Content-Length before anything reads the body, or by counting a
streamed body, and answers 413 with the project's error shape. `BodySizeLimit` is the middleware (the PDP's);
`budget_for` is its check, which the API's one edge layer (api/edge.py) runs in its own pass.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Refusal = tuple[int, str, str]  # (status, error code, reason)


def _body_limit(scope: Scope, max_bytes: int, larger: dict[str, int]) -> int:
    """The body limit of this request: `max_bytes`, or more for a path `larger` names (a fabric file import)."""
    more = larger.get(scope.get("path", "")) if larger else None
    return max(max_bytes, more) if more is not None else max_bytes


def _declared_refusal(scope: Scope, max_bytes: int) -> Refusal | None:
    """What to answer a request whose Content-Length is not a number (400) or larger than `max_bytes` (413)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                size = int(value)
            except ValueError:
                return 400, "invalid_request", "Content-Length is not a number"
            if size > max_bytes:
                return 413, "payload_too_large", too_large(max_bytes)
    return None


def too_large(max_bytes: int) -> str:
    return f"request body larger than {max_bytes} bytes"


class BodyBudget:
    """One request's body, counted as the app receives it: past `max_bytes` the client is answered 413 at
    once (through `send`, unless the answer has started) and the app sees a disconnect, so nothing downstream
    runs on a truncated body; `refused` then tells the sender to drop whatever the app sends afterwards."""

    __slots__ = ("_receive", "_send", "max_bytes", "received", "refused", "started")

    def __init__(self, max_bytes: int, receive: Receive, send: Send) -> None:
        self.max_bytes = max_bytes
        self._receive = receive
        self._send = send
        self.received = 0
        self.refused = False
        self.started = False  # set by the caller's sender when the app's answer starts

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.max_bytes:
                self.refused = True
                if not self.started:
                    self.started = True
                    await reject(self._send, 413, "payload_too_large", too_large(self.max_bytes))
                return {"type": "http.disconnect"}
        return message


async def budget_for(scope: Scope, receive: Receive, send: Send, max_bytes: int,
                     larger: dict[str, int] | None = None) -> BodyBudget | None:
    """This request's BodyBudget (its limit `max_bytes`, or more for a path `larger` names); None when its
    Content-Length was refused, answered 400 or 413 through `send`."""
    limit = _body_limit(scope, max_bytes, larger or {})
    refusal = _declared_refusal(scope, limit)
    if refusal is not None:
        await reject(send, *refusal)
        return None
    return BodyBudget(limit, receive, send)


class BodySizeLimit:
    """Refuses bodies above `max_bytes` with 413, by Content-Length up front or by counting a stream;
    `larger` names paths allowed more (a fabric file import)."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = dict(larger or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        budget = await budget_for(scope, receive, send, self.max_bytes, self.larger)
        if budget is None:
            return

        async def tracking_send(message: Message) -> None:
            if budget.refused:
                return
            if message["type"] == "http.response.start":
                budget.started = True
            await send(message)

        await self.app(scope, budget.receive, tracking_send)


async def reject(send: Send, status: int, code: str, reason: str,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer with the project's error shape ({"error", "reason"}) and `headers` besides its own."""
    await answer(send, status, json.dumps({"error": code, "reason": reason}).encode(), b"application/json", headers)


async def answer(send: Send, status: int, body: bytes, content_type: bytes,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer `body` whole, with its type, its length and `headers`."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})
