"""Request limits: body size (pure ASGI, before anything parses it) and a per-principal rate limit."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import TrustfabricError

MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class RateLimited(TrustfabricError):
    """Too many requests from one principal (HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PayloadTooLarge(TrustfabricError):
    """The request body is larger than the configured limit (HTTP 413)."""


class TokenBucket:
    """Per-key token buckets: `rate` tokens a second, at most `burst` saved up. Thread-safe, in-process."""

    def __init__(self, rate: float, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.max_keys = max_keys
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """0 when allowed, else the seconds until a token is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            if len(self._state) > self.max_keys:
                self._state.clear()
            return (1.0 - tokens) / self.rate

    def check(self, key: str) -> None:
        wait = self.take(key)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(f"rate limit exceeded for {key}; retry after {retry}s", retry)


class BodySizeLimit:
    """Refuses bodies above `max_bytes` with 413, by Content-Length up front or by counting a stream."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
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
