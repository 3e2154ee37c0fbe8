"""Keeps a PDP's engine on the control plane's active policy version and current data, polling the
database; the engine is any PolicyEngine (the PDP never names an implementation)."""

from __future__ import annotations

import logging
import threading

from core.clock import Clock, system_clock
from policy.decide import sync_data
from policy.engines import PolicyEngine
from store.db import Database

log = logging.getLogger("trustfabric.pdp")


class PdpSync:
    """Keeps a PDP's engine on the active policy version and the current data, polling the database."""

    def __init__(
        self, db: Database, engine: PolicyEngine, *, interval: float = 2.0, clock: Clock = system_clock
    ) -> None:
        self.db = db
        self.engine = engine
        self.interval = interval
        self.clock = clock
        self.active_hash: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        from policy.data import build_data
        from policy.service import active_version

        with self.db.read_session() as session:
            current = active_version(session)
            data = build_data(session, self.clock())
        if current is None:
            if self.active_hash is not None or self.engine.modules():
                log.warning("no active policy version: the PDP denies everything")
            self.engine.load({})
            self.active_hash = None
        elif current.content_hash != self.active_hash or self.engine.modules() != current.modules:
            self.engine.load(current.modules)  # also undoes any module loaded by other means
            self.active_hash = current.content_hash
        sync_data(self.engine, data)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except Exception:
                log.exception("pdp refresh failed; keeping the last good policy and data")

    def start(self) -> None:
        self.run_once()
        self._thread = threading.Thread(target=self._loop, name="pdp-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
