"""Serving the API with uvicorn, bounded against slow and numerous clients, and shut down cleanly on a signal.

The protocol is uvicorn's httptools one (llhttp, in C): ~35 us of CPU per request where h11 took ~100 us
(a bare app, closed loop on loopback), on the event loop every request of a replica goes through. What
uvicorn enforces by itself with it, checked with real sockets (tests/api/test_server.py): `timeout_keep_alive`
(an idle connection after a response is closed) and `limit_concurrency` (503 once that many connections or
tasks exist). What it does not, and `BoundedProtocol` adds: a request head still incomplete after more than
`max_header_bytes` is a 400 (httptools buffers a head without bound; h11 had this bound, and parses a complete
head arriving in one read whatever its size, up to the 256 KiB the transport reads at a time: so does this);
a request read deadline armed when a connection opens and when the next request on it begins, cancelled once
the whole request is read (a client sending its head or body a byte at a time, or nothing at all, is
otherwise never timed out); and a maximum number of open connections, beyond which a new one is closed at
once.

`serve` removes the TLS temporary directory on SIGTERM, SIGINT and SIGHUP (issue 13, item 12): uvicorn
re-raises the signal it handled after restoring the previous handler, which, left at the default, ended
the process before any `finally` ran.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from api.auth.mtls import PeerCertHttpToolsProtocol

log = logging.getLogger("trustfabric.api.server")
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class ConnectionLimits:
    request_read_timeout: float = 10.0  # seconds from a request's first byte (or the connection) to its end
    keep_alive_timeout: float = 5.0  # idle seconds after a response before the connection is closed
    max_connections: int = 1000  # open connections per worker process; more are closed at once
    max_header_bytes: int = 16 * 1024  # a request head (line and headers) larger than this is a 400
    # seconds a stopping server waits for requests in flight: a held long-poll (up to 60 s) must not keep a
    # SIGTERM waiting past a supervisor's kill, which would leave the TLS temp directory behind
    graceful_shutdown_timeout: int = 5


class _Refusals:
    """Counts refused connections and logs them at most once a second (a flood must not flood the log)."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = 0.0

    def note(self, client: str, limit: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            self._logged_at = now
            log.warning("refusing connections at the limit of %d open (TRUSTFABRIC_MAX_CONNECTIONS): %d so far, "
                        "the latest from %s", limit, self.count, client)


_refused = _Refusals()


class BoundedProtocol(PeerCertHttpToolsProtocol):
    """PeerCertHttpToolsProtocol with a bound on an incomplete request head, a request read deadline and a cap
    on open connections. The limits come from the uvicorn Config (`config.tf_limits`, set by `uvicorn_config`;
    it travels to worker processes)."""

    _deadline: float | None = None  # when the request being read must be whole (None: none is being read)
    _watch: Any = None  # the connection's one timer, at a deadline no later than `_deadline`
    _cycle_at_arm: Any = None
    _in_head = False  # between the first byte of a request and the end of its head
    _head_bytes = 0  # bytes of the reads that ended with the head incomplete (each read counted whole) ...
    _completed_in_read = False  # ... but for a read that also held the end of the request before it
    _charge_read = True

    @property
    def limits(self) -> ConnectionLimits:
        found = getattr(self.config, "tf_limits", None)
        return found if isinstance(found, ConnectionLimits) else ConnectionLimits()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            _refused.note(self.client[0] if self.client else "?", self.limits.max_connections)
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first byte of the next request on a kept-alive connection
        self._completed_in_read, self._charge_read = False, True
        super().data_received(data)
        if self._in_head and self._charge_read and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self.send_400_response("Request head too large.")
                return
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle_at_arm and not cycle.more_body:
            self._disarm()  # this request was read whole

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        # pipelined: this read also held the request before, whose bytes cannot be told from this head's; the
        # head is charged from the next read on (the bound holds one read later)
        self._charge_read = not self._completed_in_read
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._completed_in_read = True
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def shutdown(self) -> None:
        """The server starts to stop (on the event loop, for each open connection): a request in flight on this
        connection that the app can end early (a held long-poll: app.state.server_stopping) is ended now,
        before uvicorn waits for it (graceful_shutdown_timeout) and then cancels it."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            state = getattr(cycle.scope.get("app"), "state", None)  # Starlette puts itself in the scope
            stopping = getattr(state, "server_stopping", None)
            if callable(stopping):
                stopping()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    # The deadline is a number each request sets and clears; the connection's one timer fires at the earliest
    # deadline set and looks again at the latest (a timer made and cancelled per request was ~3% of the event
    # loop's samples under bench/replicas.py's load; bench/http_protocol.py: 43-47 -> 39-40 us per request).
    def _arm(self) -> None:
        self._cycle_at_arm = self.cycle
        self._deadline = self.loop.time() + self.limits.request_read_timeout
        if self._watch is None:
            self._watch = self.loop.call_at(self._deadline, self._read_timed_out)

    def _disarm(self) -> None:
        self._deadline = None

    def _read_timed_out(self) -> None:
        self._watch = None
        if self._deadline is None:
            return
        if self.loop.time() < self._deadline:  # a later request's deadline: look again then
            self._watch = self.loop.call_at(self._deadline, self._read_timed_out)
            return
        self._deadline = None
        if not self.transport.is_closing():
            log.info("closing a connection from %s: request not read within %.0f s",
                     self.client[0] if self.client else "?", self.limits.request_read_timeout)
            self.transport.close()


def uvicorn_config(app: Any, *, host: str, port: int, workers: int, log_level: str, limits: ConnectionLimits,
                   **options: Any) -> uvicorn.Config:
    """The uvicorn Config `serve` runs: our protocol, the limits uvicorn enforces itself, ours on the side. The event
    loop is uvicorn's "auto", which is uvloop (a dependency): measured against asyncio's own loop, back to back on
    bench/replicas.py, 6-9% less CPU per grant request and a p99 2-3.5 ms lower with 3 replicas on 2 cores."""
    config = uvicorn.Config(
        app, host=host, port=port, workers=workers, log_level=log_level, http=BoundedProtocol,
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout)), limit_concurrency=limits.max_connections,
        timeout_graceful_shutdown=limits.graceful_shutdown_timeout, **options,
    )
    config.tf_limits = limits  # type: ignore[attr-defined]
    return config


class _Supervisor(Multiprocess):
    """uvicorn's worker supervisor, except that SIGHUP stops the server (as it does with one process)
    instead of restarting the workers."""

    def handle_hup(self) -> None:
        self.handle_term()


def serve(config: uvicorn.Config, *, cleanup: Callable[[], None] = lambda: None) -> int | None:
    """Run the server until it stops; `cleanup` runs however it stops, a shutdown signal included.
    Returns the signal that stopped it (None otherwise); the caller re-raises it after its own cleanup."""
    received: list[int] = []
    server = uvicorn.Server(config)

    def stop(sig: int, _frame: FrameType | None) -> None:
        received.append(sig)
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in SHUTDOWN_SIGNALS}
    try:
        if config.workers > 1:
            sock = config.bind_socket()
            _Supervisor(config, sockets=[sock]).run()
        else:
            server.run()
    except KeyboardInterrupt:
        received.append(signal.SIGINT)
    finally:
        try:
            cleanup()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return received[0] if received else None
