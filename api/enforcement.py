"""How the server runs the enforcer: the reconciler on its own thread, woken right after every successful write
(`wakes_for`, by api/edge.py), and the device API's long-polls woken by publications (`PublicationWatch`).

A held long-poll is an awaited asyncio.Event: it holds neither a worker thread nor a database connection.
Publications of this process wake it at once (the reconciler's `on_publish` hook, from its thread);
publications of other processes or replicas are seen by ONE shared poll per process of the publication
counter (the highest id of `enforcer_rulesets`, an index lookup), every `poll_seconds` and only while
someone waits, so thousands of waiting agents cost one query per poll, not one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable

from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from core.asgi import Scope
from enforcer.models import RuleSetVersion
from enforcer.reconcile import Reconciler
from store.db import Database

log = logging.getLogger("trustfabric.api.enforcement")
_rulesets = RuleSetVersion.__table__  # type: ignore[attr-defined]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Writes under these paths never change the fabric (grants, credentials: enforcer.reconcile.LEAVE_FABRIC and
# IRRELEVANT): an idle reconciler (no device) is not woken for them.
LEAVE_FABRIC_PATHS = ("/v1/grants", "/v1/svids")


def wakes_for(scope: Scope) -> bool | None:
    """After a write request answered below 400 (it committed) the reconciler is woken (api/edge.py): None for
    a request that is not a write; else whether the write may have changed the fabric."""
    if scope.get("method") not in WRITES:
        return None
    return not str(scope.get("path", "")).startswith(LEAVE_FABRIC_PATHS)


class PublicationWatch:
    def __init__(self, db: Database, poll_seconds: float = 0.5) -> None:
        self.db = db
        self.poll_seconds = poll_seconds
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task[None] | None = None
        self._seen: int | None = None
        self.closing = False  # the server is stopping: a long-poll answers at once (close)

    def _latest(self, after: int | None) -> tuple[int, set[str]]:
        with self.db.read_session() as s:
            conn = s.connection()
            top = int(conn.execute(select(func.coalesce(func.max(_rulesets.c.id), 0))).scalar_one())
            if after is None or top <= after:
                return top, set()
            rows = conn.execute(select(_rulesets.c.device).where(_rulesets.c.id > after).distinct()).all()
            return top, {r[0] for r in rows}

    @contextlib.asynccontextmanager
    async def subscription(self, device: str) -> AsyncIterator[asyncio.Event]:
        """An event set by every publication for `device` from now on. Subscribe BEFORE reading the device's
        current version: a publication between the read and the wait then still wakes the waiter."""
        self._loop = asyncio.get_running_loop()
        if self._seen is None:
            self._seen, _ = await run_in_threadpool(self._latest, None)
        event = asyncio.Event()
        self._waiters.setdefault(device, set()).add(event)
        if self._poller is None or self._poller.done():
            self._poller = self._loop.create_task(self._poll())
        try:
            yield event
        finally:
            waiters = self._waiters.get(device)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[device]

    def notify(self, devices: Iterable[str]) -> None:
        """Wake the waiters of `devices`; callable from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop is shutting down
            loop.call_soon_threadsafe(self._fire, list(devices))

    def close(self) -> None:
        """The server is stopping (api/server.py, on the event loop): every held long-poll answers now, and
        none waits from here on. Left waiting, each was cancelled at the end of uvicorn's graceful wait, an
        error with a traceback in the log per agent, and the agents learned nothing until then."""
        self.closing = True
        for events in self._waiters.values():
            for event in events:
                event.set()

    def _fire(self, devices: list[str]) -> None:
        for d in devices:
            for event in self._waiters.get(d, ()):
                event.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if not self._waiters:
                self._seen = None  # the next subscriber starts from what is published then
                return
            try:
                top, devices = await run_in_threadpool(self._latest, self._seen)
            except Exception:  # the database is away: the waiters time out, the next poll retries
                log.warning("publication poll failed", exc_info=True)
                continue
            self._seen = max(self._seen or 0, top)
            if devices:
                self._fire(sorted(devices))


class EnforcerRuntime:
    """The reconciler's thread for the app's lifetime."""

    def __init__(self, reconciler: Reconciler, watch: PublicationWatch) -> None:
        self.reconciler = reconciler
        previous = reconciler.on_publish

        def published(devices: list[str]) -> None:
            watch.notify(devices)
            if previous is not None:
                previous(devices)

        reconciler.on_publish = published
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.reconciler.serve, args=(self._stop,), name="trustfabric-enforcer",
                                        daemon=True)
        self._thread.start()
        self.reconciler.wake()  # the first run: publish what the database says now

    def stop(self) -> None:
        self._stop.set()
        self.reconciler.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.reconciler.close()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

