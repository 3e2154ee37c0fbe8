"""Exports stream: peak memory does not grow with the log (100,000 vs 400,000 events on SQLite; PostgreSQL
through a server-side cursor). Each export runs in a fresh process that reports its peak RSS.

Flat memory is shown by the difference between the two sizes, not by one huge log: a buffered export
would grow by ~120 MiB from 100k to 400k events (the file's size), a streamed one by nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from store.db import Database, sqlite_url
from tests.audit.bulk import bulk_fill
from tests.conftest import ROOT, PostgresServer
from workflows.schema import migrate

pytestmark = pytest.mark.slow
GROWTH_LIMIT_KIB = 16 * 1024  # a buffered export of 400k events would need ~120 MiB more than one of 100k


def _export_rss(url: str, out: Path, fmt: str = "jsonl") -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.audit.export_rss", url, str(out), fmt],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _growth(result: dict[str, int]) -> int:
    return result["after_kib"] - result["before_kib"]


def _sqlite(path: Path, n: int) -> str:
    path.mkdir()
    db = Database(sqlite_url(path))
    migrate(db.engine)
    bulk_fill(db, n)
    db.dispose()
    return db.url


def test_export_memory_stays_flat_from_100k_to_400k_events_on_sqlite(tmp_path: Path) -> None:
    small_url, big_url = _sqlite(tmp_path / "small", 100_000), _sqlite(tmp_path / "big", 400_000)
    small = _export_rss(small_url, tmp_path / "small.jsonl")
    big = _export_rss(big_url, tmp_path / "big.jsonl")
    assert (small["events"], big["events"]) == (100_000, 400_000)
    size = (tmp_path / "big.jsonl").stat().st_size
    assert size > 100 * 1_000_000  # the file really holds every event
    assert size - (tmp_path / "small.jsonl").stat().st_size > 4 * GROWTH_LIMIT_KIB * 1024  # >> the growth allowed
    assert _growth(big) < _growth(small) + GROWTH_LIMIT_KIB, (small, big)
    assert _growth(big) < 64 * 1024, big


@pytest.mark.postgres
def test_export_streams_from_postgresql(postgres_server: PostgresServer, tmp_path: Path) -> None:
    urls = []
    for n in (20_000, 200_000):
        db = Database(postgres_server.create_database())
        migrate(db.engine)
        bulk_fill(db, n)
        db.dispose()
        urls.append(db.url)
    small = _export_rss(urls[0], tmp_path / "small.jsonl")
    big = _export_rss(urls[1], tmp_path / "big.jsonl", "jsonl")
    assert (small["events"], big["events"]) == (20_000, 200_000)
    # without a server-side cursor psycopg would hold all 200k rows (~80 MiB) at once
    assert _growth(big) < _growth(small) + GROWTH_LIMIT_KIB, (small, big)
