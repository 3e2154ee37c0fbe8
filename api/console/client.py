"""The console's only way to data: the HTTP API of the same app, called in process over ASGI with the
signed-in principal's credential as the bearer. Every page is therefore authenticated, authorized (by
api_authz.rego), scoped and rate limited exactly as the API is; the console holds no privilege of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

BASE_URL = "http://console.internal"

Params = Mapping[str, str | int | bool | Sequence[str | int] | None]


class ApiError(Exception):
    """The API refused: its status and its reason (shown to the person as the API gave it)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    reason = body.get("reason") if isinstance(body, dict) else None
    if isinstance(reason, str):
        return reason
    return response.reason_phrase


def _clean(params: Params | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if v is not None and v != ""}


@dataclass
class Api:
    """One principal's view of the API for one console request."""

    app: ASGIApp
    token: str
    request_id: str

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "X-Request-ID": self.request_id}

    async def _send(self, method: str, path: str, *, params: Params | None = None, body: Any = None,
                    headers: Mapping[str, str] | None = None) -> httpx.Response:
        """The answer when it is not an error, else ApiError with the API's status and reason."""
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            response = await client.request(method, path, params=_clean(params), json=body,
                                            headers={**self._headers(), **(headers or {})})
        if response.status_code >= 400:
            raise ApiError(response.status_code, _reason(response))
        return response

    async def call(self, method: str, path: str, *, params: Params | None = None, body: Any = None,
                   headers: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON answer, or ApiError with the API's status and reason."""
        response = await self._send(method, path, params=params, body=body, headers=headers)
        return response.json() if response.content else None

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params=params)

    async def get_when_ready(self, path: str, **params: Any) -> Any | None:
        """GET of an answer that may take seconds to compute: the decoded JSON when the API has it current,
        else None while the API computes it (it answered 202 to `Prefer: respond-async`; ask again)."""
        response = await self._send("GET", path, params=params, headers={"Prefer": "respond-async"})
        return None if response.status_code == 202 else response.json()

    async def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        return await self.call("POST", path, body=body if body is not None else {}, headers=headers)

    async def stream(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], AsyncIterator[bytes]]:
        """(status, headers, body chunks) of a streamed answer (an export), passed on as the API sends it
        instead of buffered whole as httpx's ASGI transport would. ApiError when the status is >= 400."""
        payload = json.dumps(body).encode()
        headers = [(k.lower().encode(), v.encode()) for k, v in self._headers().items()]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                    (b"host", b"console.internal")]
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": headers, "client": ("127.0.0.1", 0), "server": ("console.internal", 80), "state": {},
        }
        queue: asyncio.Queue[Message | None] = asyncio.Queue(maxsize=32)
        done = asyncio.Event()
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            await queue.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await queue.put(None)

        task = asyncio.create_task(run())
        start = await queue.get()
        if start is None or start["type"] != "http.response.start":
            done.set()
            await task
            raise ApiError(500, "the API sent no answer")
        status = int(start["status"])
        out_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}

        async def chunks() -> AsyncIterator[bytes]:
            finished = False
            try:
                while (message := await queue.get()) is not None:
                    if message["type"] == "http.response.body":
                        if message.get("body"):
                            yield bytes(message["body"])
                        if not message.get("more_body", False):
                            finished = True
                            break
            finally:
                done.set()
                if not finished:  # the reader went away: stop the API's stream (it closes its spool files)
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        if status >= 400:
            body_bytes = b"".join([c async for c in chunks()])
            try:
                reason = json.loads(body_bytes).get("reason", "")
            except (ValueError, AttributeError):
                reason = body_bytes[:500].decode(errors="replace")
            raise ApiError(status, str(reason))
        return status, out_headers, chunks()
