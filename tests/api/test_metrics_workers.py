"""`trustfabric serve --workers 2`: every worker writes its own metrics files and any scrape -- whichever worker
answers, or the separate unauthenticated listener (TRUSTFABRIC_METRICS_PORT) -- sums them all, so request
counts stay exact with several processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.policy.conftest import free_port
from tests.servers import HTTP, serve_binary

BIN = str(Path(sys.executable).parent / "trustfabric")
pytestmark = pytest.mark.xdist_group("binary-servers")


def _healthz_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "trustfabric_http_requests":
            return sum(s.value for s in family.samples
                       if s.name == "trustfabric_http_requests_total" and s.labels["route"] == "/healthz")
    return 0.0


def test_counts_are_summed_across_workers(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    multiproc = tmp_path / "metrics"
    multiproc.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRUSTFABRIC_", "PROMETHEUS_", "OTEL_"))}
    env.update({"TRUSTFABRIC_HOME": str(tmp_path / "home"), "TRUSTFABRIC_METRICS_TOKEN": "scrape-me",
                "TRUSTFABRIC_METRICS_PORT": str(metrics_port), "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
                "TRUSTFABRIC_LOG_LEVEL": "warning"})
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer scrape-me"}

    def scraped() -> float:
        r = HTTP.get(f"{base}/metrics", headers=auth, timeout=30)  # answered by either worker
        assert r.status_code == 200
        return _healthz_count(r.text)

    with serve_binary([BIN, "serve", "--port", str(port), "--workers", "2"], port=port, env=env, cwd=tmp_path):
        # the readiness probes are counted too, and one that timed out on our side may still be answered late:
        # start from a count that has settled
        start, deadline = scraped(), time.monotonic() + 30
        while True:
            time.sleep(0.3)
            if (now := scraped()) == start:
                break
            start = now
            assert time.monotonic() < deadline, "the readiness probes' count never settled"
        served, deadline = 0, time.monotonic() + 90  # a loaded machine starts the second worker late
        while len({p.name for p in multiproc.glob("counter_*.db")}) < 2:  # both workers have answered once
            assert HTTP.get(f"{base}/healthz", timeout=30).status_code == 200
            served += 1
            assert time.monotonic() < deadline, "the second worker never answered"
        for _ in range(20):
            assert HTTP.get(f"{base}/healthz", timeout=30).status_code == 200
            served += 1
        counts = {scraped() for _ in range(6)}
        assert counts == {start + served}
        aside = HTTP.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30)
        assert aside.status_code == 200 and _healthz_count(aside.text) == start + served
        writers = {p.name.rsplit("_", 1)[-1] for p in multiproc.glob("counter_*.db")}
        assert len(writers) >= 2, writers  # two worker processes wrote their own files
