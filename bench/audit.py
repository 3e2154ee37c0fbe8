"""Audit log benchmark: durable appends per second (single and batched) on SQLite and PostgreSQL, and
offline verification throughput of an export beside raw hashlib.sha256 over the same bytes.

    .venv/bin/python bench/audit.py [--runs 5] [--verify-events 200000]

Durable means fsync on commit: SQLite runs with synchronous=FULL here (the store's default is NORMAL,
which WAL makes crash-safe but not power-loss-safe); the throwaway PostgreSQL runs with fsync=on and
synchronous_commit=on. Baselines are measured in the same run: a plain INSERT of the same columns in
the same transaction pattern (what tamper evidence costs), and hashlib.sha256 over the export's bytes.
Every figure is the median of --runs runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, Text, event, insert  # noqa: E402

from audit import Actor, record  # noqa: E402
from bench.progress import Progress  # noqa: E402
from core.clock import system_clock  # noqa: E402
from store.db import Database, sqlite_url  # noqa: E402
from workflows.schema import migrate  # noqa: E402

SINGLE = 200
BATCH_TX = 100
BATCHED = 5000

_meta = MetaData()
plain = Table(
    "bench_plain_events",
    _meta,
    Column("seq", Integer, primary_key=True),
    Column("ts", DateTime(timezone=True)),
    Column("actor_id", String(512)),
    Column("actor_kind", String(32)),
    Column("tenant", String(63)),
    Column("action", String(64)),
    Column("object_type", String(64)),
    Column("object_id", String(512)),
    Column("summary", Text),
    Column("data", Text),
)


def line(figure: str, value: float, unit: str, base: float, base_unit: str) -> None:
    print(f"{figure}: {value:,.0f} {unit} (baseline {base:,.0f} {base_unit}, ratio {value / base:.2f})", flush=True)


def median_rate(runs: int, count: int, fn: Callable[[], None]) -> float:
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        rates.append(count / (time.perf_counter() - t0))
    return statistics.median(rates)


def appends(db: Database, total: int, per_tx: int) -> Callable[[], None]:
    actor = Actor("bench", "system")
    counter = [0]

    def run() -> None:
        done = 0
        while done < total:
            with db.session() as s:
                for _ in range(min(per_tx, total - done)):
                    i = counter[0]
                    record(
                        s,
                        actor=actor,
                        action="ruleset.apply",
                        object_type="ruleset",
                        object_id=f"rs-{i}",
                        tenant="acme",
                        summary={"before": f"{i:064x}", "after": f"{i + 1:064x}"},
                    )
                    counter[0] += 1
                    done += 1

    return run


_plain_seq = [0]


def plain_inserts(db: Database, total: int, per_tx: int) -> Callable[[], None]:
    counter = _plain_seq

    def run() -> None:
        done = 0
        while done < total:
            with db.session() as s:
                conn = s.connection()
                for _ in range(min(per_tx, total - done)):
                    i = counter[0]
                    conn.execute(
                        insert(plain),
                        {
                            "seq": i,
                            "ts": system_clock(),
                            "actor_id": "bench",
                            "actor_kind": "system",
                            "tenant": "acme",
                            "action": "ruleset.apply",
                            "object_type": "ruleset",
                            "object_id": f"rs-{i}",
                            "summary": f'{{"after":"{i + 1:064x}","before":"{i:064x}"}}',
                            "data": "x" * 420,
                        },
                    )
                    counter[0] += 1
                    done += 1

    return run


def bench_appends(name: str, db: Database, runs: int) -> None:
    _meta.create_all(db.engine)
    for label, total, per_tx in (("single", SINGLE, 1), (f"batched {BATCH_TX}/tx", BATCHED, BATCH_TX)):
        base = median_rate(runs, total, plain_inserts(db, total, per_tx))
        rate = median_rate(runs, total, appends(db, total, per_tx))
        line(f"{name} durable appends, {label} [{total} per run]", rate, "appends/s", base, "plain inserts/s")


def sqlite_db(base: Path) -> Database:
    base.mkdir()
    db = Database(sqlite_url(base))

    @event.listens_for(db.engine, "connect")
    def _durable(dbapi_conn: Any, _record: Any) -> None:  # after the store's own settings
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    db.engine.dispose()
    migrate(db.engine)
    return db


class DurablePostgres:
    """A throwaway cluster like the tests' one, but with fsync on: durable commits are what is measured."""

    def __init__(self) -> None:
        from tests.conftest import _free_port, _pg_bin

        initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not self.pg_ctl:
            raise RuntimeError("PostgreSQL server binaries not installed")
        self.base = Path(tempfile.mkdtemp(prefix="tf-bench-pg-"))
        self.data = self.base / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            [*self.as_user, initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        port = _free_port()
        opts = f"-p {port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on"
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.base / "log"), "-w", "start"],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(self.pg_ctl), "-D", str(self.data), "-m", "fast", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)


def bench_verify(base: Path, runs: int, events: int) -> None:
    from audit.export import export_events
    from audit.export.jsonl import EVENT_PREFIX, SUFFIX_LEN
    from audit.verify import verify_export
    from audit.verify.fast import verify_whole
    from tests.audit.bulk import bulk_fill
    from tests.audit.conftest import KeySigner

    db = Database(sqlite_url(base))
    migrate(db.engine)
    bulk_fill(db, events)
    signer = KeySigner()
    path = base / "export.jsonl"
    with open(path, "wb") as fh:
        export_events(db, signer, fh)
    db.dispose()
    size_mb = path.stat().st_size / 1e6
    key = signer.public_key()

    def verify() -> None:
        report = verify_export(path, key)
        assert report.events == events

    def verify_one_process() -> None:  # the same fast pass without forked parts: what one core gives
        with open(path, "rb") as fh:
            report = verify_whole(fh, key, processes=1)
        assert report is not None and report.events == events

    def whole_file_sha() -> None:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)
        h.digest()

    def per_event_sha() -> None:
        sha = hashlib.sha256
        with open(path, "rb") as fh:
            for ln in fh:
                if ln.startswith(EVENT_PREFIX):
                    sha(ln[len(EVENT_PREFIX) : -SUFFIX_LEN - 1]).digest()

    # Interleaved, so all three see the same machine load; the per-event baseline's own line reading
    # is timed separately and subtracted, leaving only the hashing of each event's bytes.
    def read_lines() -> None:
        with open(path, "rb") as fh:
            for ln in fh:
                if ln.startswith(EVENT_PREFIX):
                    ln[len(EVENT_PREFIX) : -SUFFIX_LEN - 1]

    times: dict[str, list[float]] = {"verify": [], "one": [], "per_event": [], "read": [], "whole": []}
    load = os.getloadavg()[0]
    for _ in range(runs):
        for label, fn in (
            ("verify", verify),
            ("one", verify_one_process),
            ("per_event", per_event_sha),
            ("read", read_lines),
            ("whole", whole_file_sha),
        ):
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    v = events / med["verify"]
    per_event = events / max(med["per_event"] - med["read"], 1e-9)
    whole = events / med["whole"]
    scale = f"[{events} events, {size_mb:.0f} MB JSONL]"
    line(f"export verification {scale}", v, "events/s", per_event, "events/s sha256 of each event's bytes")
    line(
        f"export verification MB/s {scale}",
        v * size_mb / events,
        "MB/s",
        whole * size_mb / events,
        "MB/s sha256 streamed over the whole file",
    )
    line(
        f"export verification MB/s, one process {scale}",
        size_mb / med["one"],
        "MB/s",
        whole * size_mb / events,
        "MB/s sha256 streamed over the whole file",
    )
    print(f"(verification runs in up to {os.cpu_count()} processes; load average before: {load:.2f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--verify-events", type=int, default=200_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-audit-"))
    progress = Progress("audit")
    try:
        progress.step("appends on SQLite")
        db = sqlite_db(tmp / "sqlite")
        bench_appends("sqlite", db, args.runs)
        db.dispose()
        try:
            pg = DurablePostgres()
        except (RuntimeError, subprocess.CalledProcessError, KeyError, LookupError) as exc:
            print(f"postgresql durable appends: skipped ({exc})")
        else:
            try:
                progress.step("appends on PostgreSQL (fsync on)")
                pdb = Database(pg.url)
                migrate(pdb.engine)
                bench_appends("postgresql", pdb, args.runs)
                pdb.dispose()
            finally:
                pg.stop()
        (tmp / "verify").mkdir()
        progress.step(f"offline verification of {args.verify_events} events")
        bench_verify(tmp / "verify", args.runs, args.verify_events)
    finally:
        progress.done()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
