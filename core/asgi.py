"""A pure-ASGI request body limit, shared by the API and the PDP (both mount it; neither imports the other).

No framework import: it refuses by Content-Length before anything reads the body, or by counting a
streamed body, and answers 413 with the project's error shape.
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
        if scope.get("path") in self.larger:
            limit = max(self.max_bytes, self.larger[scope["path"]])
            await BodySizeLimit(self.app, limit)(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    await _reject(send, 400, "invalid_request", "Content-Length is not a number")
                    return
                if size > self.max_bytes:
                    await _reject(send, 413, "payload_too_large", self._reason())
                    return
        received = 0
        started = False
        refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused, started
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer 413 now and make the app see a disconnect: nothing downstream runs on a
                    # truncated body, and whatever it tries to send afterwards is dropped.
                    refused = True
                    if not started:
                        started = True
                        await _reject(send, 413, "payload_too_large", self._reason())
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracking_send)

    def _reason(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"


async def _reject(send: Send, status: int, code: str, reason: str) -> None:
    body = json.dumps({"error": code, "reason": reason}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
