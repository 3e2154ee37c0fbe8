"""The server's periodic jobs do real work on the real store: CA rotation on SPIRE's schedule and
signed audit checkpoints, each job independent of the others' failures."""

from __future__ import annotations

import logging
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from api.background import BackgroundJobs, Job, server_jobs
from audit.models import AuditEvent
from store.db import Database
from tests.api.conftest import make_settings, open_env


def _actions(env_ctx: object) -> list[str]:
    with env_ctx.db.read_session() as s:  # type: ignore[attr-defined]
        return [e.action for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]


def test_jobs_rotate_the_ca_at_half_life_and_checkpoint_the_log(tmp_path: Path) -> None:
    env = open_env(make_settings(tmp_path / "home", audit_checkpoint_every=1, audit_checkpoint_seconds=3600))
    try:
        jobs = server_jobs(env.ctx, env.app.state.trust_anchors)
        assert jobs.run_due(now=0.0) == ["grant-sweeper", "ca-rotator", "token-keys", "tls-trust-anchors",
                                               "audit-checkpoints"]
        assert "ca.prepare" not in _actions(env.ctx)  # nothing due at the start of the CA's life
        from audit.checkpoint import latest_checkpoint

        with env.ctx.db.read_session() as s:
            first = latest_checkpoint(s)
        assert first is not None and first.size == len(_actions(env.ctx))

        env.clock.advance(timedelta(days=3, hours=13))  # past half of the default 7-day CA life
        jobs.run_due(now=10_000.0)
        actions = _actions(env.ctx)
        assert actions.count("ca.prepare") == 1
        jobs.run_due(now=20_000.0)  # nothing more due: no new event, no duplicate preparation
        assert _actions(env.ctx).count("ca.prepare") == 1
        with env.ctx.db.read_session() as s:
            latest = latest_checkpoint(s)
        assert latest is not None and latest.size > first.size
    finally:
        env.client.close()
        env.ctx.close()


def test_a_failing_job_does_not_stop_the_others() -> None:
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("broken")

    jobs = BackgroundJobs([Job("bad", 1.0, boom), Job("good", 1.0, lambda: ran.append("good"))])
    assert jobs.run_due(now=0.0) == ["bad", "good"]
    assert jobs.run_due(now=0.5) == []  # not due yet
    assert jobs.run_due(now=1.0) == ["bad", "good"]
    assert ran == ["good", "good"]


def test_module_state_is_bounded_and_closed(tmp_path: Path) -> None:
    """The CA certificate cache is an LRU; the grant write lock leaves no file descriptor open; trust
    anchors belong to the app that made them (two apps never share one)."""
    import os

    from api.app import create_app
    from api.writelock import grant_writer
    from pki import ca

    env = open_env(make_settings(tmp_path / "home"))
    try:
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            with grant_writer(env.ctx):
                pass
        assert len(os.listdir("/proc/self/fd")) == fds
        assert create_app(env.ctx).state.trust_anchors is not env.app.state.trust_anchors
    finally:
        env.client.close()
        env.ctx.close()

    class Row:
        def __init__(self, pem: str) -> None:
            self.cert_pem = pem

    from tests.pki.helpers import self_signed_pem

    pems = [self_signed_pem(f"ca-{i}") for i in range(ca.CERT_CACHE_SIZE + 5)]
    for pem in pems:
        ca.certificate(Row(pem))  # type: ignore[arg-type]
    assert len(ca._cert_cache) == ca.CERT_CACHE_SIZE
    assert pems[0] not in ca._cert_cache and pems[-1] in ca._cert_cache


def test_a_job_finding_the_database_down_logs_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: while PostgreSQL restarted, every job run (and every reconciler poll, twice a second) logged an
    error with a SQLAlchemy traceback, where the API logs one warning line per 503; other failures keep theirs."""
    with socket.socket() as s:  # a port nothing listens on: the database is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = Database(f"postgresql://postgres@127.0.0.1:{port}/trustfabric")

    def read() -> None:
        with db.read_session() as session:
            session.connection().execute(text("SELECT 1"))

    def boom() -> None:
        raise RuntimeError("broken")

    try:
        with caplog.at_level(logging.WARNING, logger="trustfabric.background"):
            assert BackgroundJobs([Job("reads", 5.0, read), Job("bad", 1.0, boom)]).run_due(now=0.0) == ["reads", "bad"]
    finally:
        db.dispose()
    down, bad = caplog.records
    assert down.levelno == logging.WARNING and down.exc_info is None
    assert down.getMessage().startswith("background job reads failed; retrying in 5s: the database is unavailable (")
    assert "Connection refused" in down.getMessage() and "\n" not in down.getMessage()
    assert bad.levelno == logging.ERROR and bad.exc_info is not None and bad.exc_info[0] is RuntimeError
