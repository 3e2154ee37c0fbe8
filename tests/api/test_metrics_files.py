"""Summing the workers' metrics files (api/metrics.py WorkerFiles) while a worker is still creating its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import WorkerFiles

_WORKER = """
from prometheus_client import Counter
Counter("tf_test_requests", "requests", ["route"]).labels(route="/healthz").inc(3)
"""


def _scrape(directory: Path) -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerFiles(str(directory)))
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_file_a_worker_is_creating_leaves_the_scrape_whole(tmp_path: Path) -> None:
    """prometheus-client creates a worker's file before sizing it; a scrape that met it at 0 bytes failed whole
    (500 on /metrics with `serve --workers 2`, as the second worker answered its first request)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):  # two workers that counted 3 requests each, in their own files
        subprocess.run([sys.executable, "-c", _WORKER], env=env, check=True, timeout=60)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2
    (tmp_path / "counter_4242.db").touch()  # a third worker's, not sized yet
    (tmp_path / "histogram_4242.db").touch()
    assert _scrape(tmp_path)["tf_test_requests_total"] == 6.0
