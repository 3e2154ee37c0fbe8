"""The body limit both servers mount (core/asgi.py), as plain ASGI: refused by Content-Length before the
app reads anything, or when a streamed body passes the limit; the app never runs on a truncated body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from core.asgi import BodySizeLimit, Message


def run(coroutine: Any) -> None:
    """asyncio.run on a thread of its own: a session-scoped Playwright (the browser tests) keeps an event loop
    running in the worker's main thread, where asyncio.run refuses to start another."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()


def _call(limit: int, chunks: list[bytes], length: int | None) -> tuple[int, dict[str, Any], list[bytes]]:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[Message] = []

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [(b"content-length", str(length).encode())] if length is not None else []
    run(BodySizeLimit(app, max_bytes=limit)({"type": "http", "headers": headers}, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], (json.loads(body) if sent[0]["status"] != 200 else {}), seen


def test_under_the_limit_passes() -> None:
    status, _, seen = _call(10, [b"12345", b"678"], 8)
    assert status == 200 and b"".join(seen) == b"12345678"


def test_content_length_over_the_limit_is_refused_before_reading() -> None:
    status, body, seen = _call(10, [b"x" * 11], 11)
    assert status == 413 and body == {"error": "payload_too_large", "reason": "request body larger than 10 bytes"}
    assert seen == []


def test_a_streamed_body_over_the_limit_is_refused_and_the_app_sees_a_disconnect() -> None:
    status, body, seen = _call(10, [b"x" * 6, b"y" * 6, b"z"], None)
    assert status == 413 and body["error"] == "payload_too_large"
    assert seen == [b"x" * 6]  # the app never got the part past the limit


def test_a_malformed_content_length_is_a_400() -> None:
    sent: list[Message] = []

    async def app(*_a: Any) -> None:
        raise AssertionError("must not run")

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    run(BodySizeLimit(app, max_bytes=10)({"type": "http", "headers": [(b"content-length", b"ten")]},
                                                 receive, send))
    assert sent[0]["status"] == 400 and b"Content-Length is not a number" in sent[1]["body"]
