"""Issue 13, item 7 (slow and numerous clients), with real sockets against uvicorn serving the real app over
its httptools protocol: what uvicorn enforces itself (an idle kept-alive connection) and what api/server.py
adds (a bound on an incomplete request head, a request read deadline, a cap on open connections)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from api.server import ConnectionLimits, uvicorn_config
from tests.api.conftest import Env, make_settings, open_env
from tests.policy.conftest import free_port

LIMITS = ConnectionLimits(request_read_timeout=0.8, keep_alive_timeout=1, max_connections=4, max_header_bytes=4096)


def start(server: uvicorn.Server) -> threading.Thread:
    """`server` running on a thread of its own, returned once it accepts connections."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    return thread


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    env: Env = open_env(make_settings(tmp_path / "home"))
    port = free_port()
    server = uvicorn.Server(uvicorn_config(env.app, host="127.0.0.1", port=port, workers=1, log_level="warning",
                                           limits=LIMITS, lifespan="off"))
    thread = start(server)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        env.client.close()
        env.ctx.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes `s` within `seconds` (whatever it sent before closing is read and dropped)."""
    s.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if s.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def response(s: socket.socket) -> bytes:
    """One whole response on a kept-alive connection (its head and body may come in separate reads)."""
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(65536)
        assert chunk, "connection closed before the response head ended"
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed before the response body ended"
        body += chunk
    return out


def healthz(port: int) -> bytes:
    with connect(port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_connection_that_trickles_its_request_is_closed(served: int) -> None:
    """Item 7: uvicorn times out nothing before the first response; a client sending a byte every 0.2 s
    held its connection (and a worker's slot) for as long as it liked on the code before the fix."""
    request = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    with connect(served) as s:
        start = time.monotonic()
        try:
            for byte in request:
                s.sendall(bytes([byte]))
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_within(s, 2)
        assert time.monotonic() - start < 4  # well before the 8 s the whole request would take
    with connect(served) as idle:  # a connection that sends nothing at all
        assert closed_within(idle, 3)


def test_kept_alive_connection_gets_the_deadline_again_for_its_next_request(served: int) -> None:
    with connect(served) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b"200 OK" in s.recv(65536)
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request starts, and stalls
        assert closed_within(s, 3)


def test_open_connections_are_capped_and_the_server_recovers(served: int) -> None:
    """Item 7: every connection was accepted; the cap closes the ones beyond it at once, and the read
    deadline frees the slots the idle ones held."""
    idle = [connect(served) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)
        with connect(served) as extra:
            assert closed_within(extra, 1)  # refused at once, not queued
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert b"200 OK" in healthz(served)


def test_an_incomplete_request_head_is_bounded(served: int) -> None:
    """httptools buffers a request head without bound (h11 had h11_max_incomplete_event_size): more than
    max_header_bytes without the blank line that ends it is a 400, whether it came in one read or many ..."""
    with connect(served) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 8000)
        assert s.recv(65536).startswith(b"HTTP/1.1 400")
    with connect(served) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        answer = b""
        try:
            for i in range(20):  # 20 x 500 bytes, in separate writes: the count spans reads
                s.sendall(b"X-H%d: " % i + b"h" * 490 + b"\r\n")
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with contextlib.suppress(ConnectionResetError):
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400")
    # ... while a complete head arriving in one read is parsed whatever its size, as h11 did (the transport
    # reads at most 256 KiB at a time, which bounds it)
    with connect(served) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 8000 + b"\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    # a kept-alive connection's later requests are counted afresh: many small requests are no big head
    with connect(served) as s:
        for _ in range(5):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * 2000 + b"\r\n\r\n")
            assert response(s).startswith(b"HTTP/1.1 200")


def test_a_pipelined_request_is_not_charged_for_the_one_before_it(served: int) -> None:
    """A read holding a whole request and the start of the next counts nothing against the next one's head
    (its bytes cannot be told apart): what follows is counted, so the bound still holds, one read later."""
    first = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * 3000 + b"\r\n\r\n"
    second = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"q" * 1500 + b"\r\n\r\n"
    with connect(served) as s:
        s.sendall(first + second[:1200])  # 4.2 KB in one read, over the 4096-byte bound of LIMITS
        time.sleep(0.2)
        s.sendall(second[1200:])
        assert response(s).startswith(b"HTTP/1.1 200")
        assert response(s).startswith(b"HTTP/1.1 200")


def test_what_uvicorn_enforces_itself(served: int) -> None:
    with connect(served) as s:  # an idle kept-alive connection after a response: closed (timeout_keep_alive)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b"200 OK" in s.recv(65536)
        assert closed_within(s, 3)


def test_a_stopping_server_does_not_wait_for_a_held_long_poll() -> None:
    """A device long-poll is held up to 60 s; uvicorn's default waits for it on shutdown, so a SIGTERM'd
    `serve` outlived its supervisor's patience, was killed, and left its TLS temp directory behind. The
    config bounds the wait (graceful_shutdown_timeout)."""
    import asyncio

    async def held(scope: dict[str, object], receive: object, send: object) -> None:  # a long-poll that never ends
        if scope["type"] == "http":
            await asyncio.sleep(60)

    port = free_port()
    limits = ConnectionLimits(graceful_shutdown_timeout=1)
    server = uvicorn.Server(uvicorn_config(held, host="127.0.0.1", port=port, workers=1, log_level="critical",
                                           limits=limits, lifespan="off"))
    thread = start(server)
    with connect(port) as s:
        s.sendall(b"GET /v1/devices/nic:n1/ruleset?wait=60 HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.3)  # the request is in flight
        started = time.monotonic()
        server.should_exit = True
        thread.join(timeout=20)
        assert not thread.is_alive() and time.monotonic() - started < 5, "shutdown waited for the held request"
