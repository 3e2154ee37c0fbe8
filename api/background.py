"""Periodic work of the server process: grant expiry, CA rotation, a PKCS#11 token's key marks, audit checkpoints.

One thread runs every job on its own interval. Each job is safe to run in several worker processes at
once (each takes its own row lock), so no leader election is needed; a failing job is logged and
retried on its next tick, never allowed to stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api.metrics import JOB_DURATION, JOB_FAILURES, JOB_RUNS, timed
from audit import Actor
from store.db import log_failure
from workflows.context import AppContext

if TYPE_CHECKING:
    from api.tls import TrustAnchors

log = logging.getLogger("trustfabric.background")


@dataclass
class Job:
    name: str
    interval: float
    run: Callable[[], object]
    next_at: float = field(default=0.0)


class BackgroundJobs:
    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_due(self, now: float | None = None) -> list[str]:
        """Run every job whose time has come; returns the names run (for tests and logs)."""
        now = time.monotonic() if now is None else now
        ran = []
        for job in self.jobs:
            if now < job.next_at:
                continue
            job.next_at = now + job.interval
            JOB_RUNS.labels(job.name).inc()
            try:
                with timed(JOB_DURATION, job.name):
                    result = job.run()
                if result:
                    log.info("%s: %s", job.name, result)
            except Exception:
                JOB_FAILURES.labels(job.name).inc()
                log_failure(log, "background job %s failed; retrying in %.0fs", job.name, job.interval)
            ran.append(job.name)
        return ran

    def _loop(self) -> None:
        tick = min((j.interval for j in self.jobs), default=1.0)
        while not self._stop.wait(tick):
            self.run_due()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="trustfabric-background", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def sweep_grants(ctx: AppContext) -> list[str]:
    from policy.grants import sweep

    with ctx.db.session() as session:
        return sweep(session, clock=ctx.clock)


def rotate_cas(ctx: AppContext) -> None:
    """SPIRE's schedule: prepare at half life, activate at 1/6 before expiry; nothing due, nothing written."""
    from pki.service import trust_domain
    from workflows.rotation import rotate_cas as rotate

    with ctx.db.read_session() as session:
        if trust_domain(session) is None:
            return
    rotate(ctx, force=False, actor=Actor.system("ca-rotator"))


def tend_token_keys(ctx: AppContext) -> list[str]:
    """A PKCS#11 token, on every replica: the keys CA rows name marked committed in the token (one a replica killed
    between its rotation's commit and the mark left), and a killed rotation's keys destroyed once their intents are
    old (workflows/init.py tend_token_keys). The ids destroyed; nothing for the file key store."""
    from workflows.init import tend_token_keys as tend

    return tend(ctx)


def write_audit_checkpoint(ctx: AppContext) -> int | None:
    from workflows.exports import checkpoint_writer

    cp = checkpoint_writer(ctx).maybe_write()
    return None if cp is None else cp.size


def server_jobs(ctx: AppContext, anchors: TrustAnchors) -> BackgroundJobs:
    from api.tls import refresh_trust_anchors

    s = ctx.settings
    return BackgroundJobs([
        Job("grant-sweeper", s.sweep_interval_seconds, lambda: sweep_grants(ctx)),
        Job("ca-rotator", s.ca_rotation_check_seconds, lambda: rotate_cas(ctx)),
        Job("token-keys", s.ca_rotation_check_seconds, lambda: tend_token_keys(ctx)),
        Job("tls-trust-anchors", s.ca_rotation_check_seconds, lambda: refresh_trust_anchors(ctx, anchors)),
        Job("audit-checkpoints", min(5.0, float(s.audit_checkpoint_seconds)), lambda: write_audit_checkpoint(ctx)),
    ])
