"""The worker threads a server process hands its requests' blocking work to: at most a set number, kept for the life
of the app, the most recently used first.

Why not anyio's pool (starlette's `run_in_threadpool`): it starts a thread whenever none is idle, up to 40, and ends
a thread idle for 10 s. Policy engines are per thread (a regorus Engine cannot move between threads), so a thread's
first decision builds its own engine: 12-50 ms holding the interpreter lock at a few thousand grants. Every burst
above the last 10 s's concurrency therefore started threads that each built an engine at once, and meanwhile the
process's other requests stood still, among them the one holding the audit head lock that every replica waits on
(an open loop at 275 grant requests/s over 3 replicas: about one 0.3-0.7 s episode every 20-30 s, 33 engine builds
in one of them). Kept threads build once per policy version; taking the most recently used thread first keeps the
busy few warm and the rest for bursts.

Work waiting for a free thread waits in order of arrival, on the event loop, holding nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import Context, copy_context
from typing import Any, TypeVar

from starlette.requests import HTTPConnection

T = TypeVar("T")
log = logging.getLogger(__name__)

_Item = tuple[Context, Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


async def in_worker(request: HTTPConnection, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the app's worker threads (`app.state.workers`, made by api.app.create_app)."""
    threads: WorkerThreads = request.app.state.workers
    return await threads.run(fn, *args)


class WorkerThreads:
    """`await threads.run(fn, *args)`: `fn(*args)` on one of at most `size` kept threads, in the caller's context
    (its context variables: the request id, the span). `close` ends the threads (the app's lifespan, a test's
    client); a later `run` starts new ones."""

    def __init__(self, size: int, name: str = "trustfabric-worker") -> None:
        if size < 1:
            raise ValueError(f"worker threads: {size} (at least 1)")
        self.size = size
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # the most recently used last
        self._all: list[_Worker] = []
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[_Worker | None]]] = deque()
        self._made = 0

    @property
    def started(self) -> int:
        """Threads started since the last `close` (never more than `size`)."""
        return len(self._all)

    @property
    def waiting(self) -> int:
        """Callers waiting for a thread now."""
        return len(self._waiting)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        item: _Item = (copy_context(), fn, args, loop, result)
        while True:
            with self._lock:  # a worker's item goes in under the lock: `close`'s stop can never overtake it
                if self._idle:
                    self._idle.pop().queue.put(item)
                    break
                if len(self._all) < self.size:
                    self._new().queue.put(item)
                    break
                ticket: asyncio.Future[_Worker | None] = loop.create_future()
                self._waiting.append((loop, ticket))
            try:
                handed = await ticket  # a thread that finished its call; None: the threads were closed, ask again
            except asyncio.CancelledError:
                late = ticket.result() if ticket.done() and not ticket.cancelled() else None
                if late is not None:  # handed over just as this caller was cancelled: it goes to the next one
                    self._finished(late)
                raise
            with self._lock:
                if handed is not None and not handed.retired:
                    handed.queue.put(item)
                    break
        # cancelled, the caller goes at once and the thread finishes the call, its result dropped (_deliver)
        return await result

    def start_all(self, prepare: Callable[[], None]) -> None:
        """Start every thread not started yet, each running `prepare` (say, building its own policy engines) before
        any call: a server warms its threads as it starts, so that no request waits for a thread's first build.
        A call handed to a thread still preparing waits for it; a `prepare` that fails is logged and the thread
        serves all the same."""
        with self._lock:
            while len(self._all) < self.size:
                worker = self._new(prepare)
                self._idle.append(worker)

    def _new(self, prepare: Callable[[], None] | None = None) -> _Worker:
        """A started thread, counted; call with the lock held."""
        worker = _Worker(self, f"{self._name}-{self._made}", prepare)
        self._made += 1
        self._all.append(worker)
        worker.start()
        return worker

    def _finished(self, worker: _Worker) -> None:
        """From `worker`'s thread, its call done: to the first caller still waiting, else idle. The hand-over's
        wake of the caller's loop (a write to its pipe) is made outside the lock, so the loop never waits for
        the lock on a thread that is in a system call."""
        while True:
            with self._lock:
                if worker.retired:
                    return
                if not self._waiting:
                    self._idle.append(worker)
                    return
                loop, ticket = self._waiting.popleft()
            try:
                loop.call_soon_threadsafe(self._hand_over, ticket, worker)
                return
            except RuntimeError:  # that caller's loop is closed: it is gone
                continue

    def _hand_over(self, ticket: asyncio.Future[_Worker | None], worker: _Worker | None) -> None:
        if not ticket.cancelled():
            ticket.set_result(worker)
        elif worker is not None:  # its caller stopped waiting: the thread goes to the next one
            self._finished(worker)

    def close(self, timeout: float = 5.0) -> None:
        """Each thread ends after its current call; waits at most `timeout` seconds for them in all."""
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
            waiting = list(self._waiting)
            self._waiting.clear()
            for worker in workers:
                worker.retired = True
                worker.queue.put(None)
        for loop, ticket in waiting:  # they ask again, for new threads
            with contextlib.suppress(RuntimeError):  # a closed loop's caller is gone
                loop.call_soon_threadsafe(self._hand_over, ticket, None)
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))


class _Worker(threading.Thread):
    def __init__(self, pool: WorkerThreads, name: str, prepare: Callable[[], None] | None) -> None:
        super().__init__(name=name, daemon=True)
        self.pool = pool
        self.prepare = prepare
        self.retired = False  # under the pool's lock
        self.queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()

    def run(self) -> None:
        if self.prepare is not None:
            try:
                self.prepare()
            except BaseException as exc:  # a native panic too (pyo3's derives from BaseException): it must serve
                log.info("worker thread %s not prepared: %s", self.name, exc)
            self.prepare = None
        while True:
            item = self.queue.get()
            if item is None:
                return
            context, fn, args, loop, result = item
            value: Any = None
            error: BaseException | None = None
            try:
                value = context.run(fn, *args)
            except BaseException as exc:  # delivered to the caller, as anyio does
                error = exc
            # free first: the caller that hears of its result next finds this thread on top of the idle ones
            self.pool._finished(self)
            with contextlib.suppress(RuntimeError):  # the caller's loop closed meanwhile: nobody to tell
                loop.call_soon_threadsafe(_deliver, result, value, error)
            del item, context, fn, args, result, value, error  # nothing of the call outlives it here


def _deliver(result: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if result.cancelled():
        return
    if error is not None:
        result.set_exception(error)
    else:
        result.set_result(value)
