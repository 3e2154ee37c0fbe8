"""Statements PostgreSQL receives per POST /v1/grants, counted in the server's own statement log
(`log_statement = all`): every round trip a request costs the database (~50 us of its CPU) and the replica more
(SQLAlchemy and the driver), whatever code sent it. Issue 11's goal for this figure: <= 10 per grant on one
replica (it was ~21 before; tests/api/test_round_trips.py holds the request's own statements to their budget).

3 replicas of `trustfabric serve` on one PostgreSQL (as bench/replicas.py runs them, reconcilers idle): N grants
one after another through one replica, then N by 8 concurrent requesters spread over the 3 replicas; every
statement logged while they run is counted (background work too, a poll or a checkpoint: it shows beside the
request's own). Medians of RUNS runs; the statements of the kinds sent most printed as comment lines.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import call
from bench.progress import Progress
from bench.replicas import BIN, GRANT, mint, seed, with_postgres
from tests.conftest import _free_port
from tests.servers import replica_env, serve_replicas

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
N = int(os.environ.get("BENCH_GRANTS", "200"))  # per run and mode
GOAL = 10.0
_LOGGED = re.compile(r"LOG:  (?:statement|execute [^:]*): (.*)$")


def _settled(log: Path, timeout: float = 5.0) -> int:
    """The log's size once it stopped growing for 0.3 s (the last responses' statements are logged before they
    are answered; a background poll may still come), at most `timeout` seconds from now."""
    deadline = time.monotonic() + timeout
    size = log.stat().st_size
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = log.stat().st_size
        if now == size:
            break
        size = now
    return size


def _count(log: Path, grants: int, send: Callable[[], None]) -> tuple[float, collections.Counter[str]]:
    start = _settled(log)
    send()
    end = _settled(log)
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(end - start).decode(errors="replace")
    kinds: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        m = _LOGGED.search(line)
        if m is not None:
            kinds[" ".join(m.group(1).split())[:60]] += 1
    return sum(kinds.values()) / grants, kinds


def run(work: Path, database_url: str, log: Path) -> list[str]:
    import psycopg

    progress = Progress("roundtrips")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    env = replica_env(dict(os.environ), home=work / "home", database_url=database_url,
                      TRUSTFABRIC_SWEEP_INTERVAL_SECONDS="30", TRUSTFABRIC_QUOTA_PENDING="0",
                      TRUSTFABRIC_QUOTA_GRANTS="0")
    ports = [_free_port() for _ in range(3)]
    progress.step("starting 3 replicas")
    with serve_replicas(BIN, 3, env=env, cwd=work, ports=ports):
        admin = mint(env, work, "--role", "admin")
        seed(ports[0], admin)
        acme = mint(env, work, "--role", "tenant-admin", "--tenant", "acme")
        for port in ports:  # each replica's first decisions build its engines and prepare its statements
            for _ in range(6):
                assert call(port, "POST", "/v1/grants", acme, GRANT)[0] == 201

        def sequential() -> None:
            for _ in range(N):
                assert call(ports[0], "POST", "/v1/grants", acme, GRANT)[0] == 201

        def concurrent() -> None:
            def requester(i: int) -> None:
                for _ in range(N // 8):
                    assert call(ports[i % 3], "POST", "/v1/grants", acme, GRANT)[0] == 201
            threads = [threading.Thread(target=requester, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)

        one, three = [], []
        kinds: collections.Counter[str] = collections.Counter()
        kinds3: collections.Counter[str] = collections.Counter()
        for r in range(RUNS):
            progress.step(f"run {r + 1}/{RUNS}: {N} grants one after another, then by 8 requesters")
            per, seen = _count(log, N, sequential)
            one.append(per)
            kinds = seen if r == 0 else kinds
            per, seen = _count(log, N // 8 * 8, concurrent)
            three.append(per)
            kinds3 = seen if r == 0 else kinds3
    progress.done()
    a, b = statistics.median(one), statistics.median(three)
    return [
        f"# scale: 3 replicas x 1 uvicorn worker on one PostgreSQL (own cluster), {N} grants per mode, "
        f"median of {RUNS} runs; every statement the server logged while they ran",
        f"post_grants_statements_per_request_1_replica: {a:.1f} statements (baseline goal {GOAL:.1f} statements, "
        f"ratio {a / GOAL:.2f})",
        f"post_grants_statements_per_request_3_replicas_8_requesters: {b:.1f} statements (baseline 1 replica "
        f"{a:.1f} statements, ratio {b / a:.2f})",
        "# one replica, one request at a time, the kinds sent most:",
        *(f"#   {n / N:5.2f} per grant: {k}" for k, n in kinds.most_common(10)),
        "# 3 replicas, 8 requesters (BEGIN and COMMIT per grant: 1 / the mean group-commit batch; the head's lock, its "
        "counters and scan are one call, tf_lock_audit_head, whether or not it waited for another replica's commit):",
        *(f"#   {n / (N // 8 * 8):5.2f} per grant: {k}" for k, n in kinds3.most_common(12)),
        f"goal <= {GOAL:g} statements per grant on one replica: {'met' if a <= GOAL else 'NOT met'} ({a:.1f})",
    ]


def _run_on(work: Path, url: str, postmaster: int) -> list[str]:
    """run() on bench/replicas.py's cluster: its server log lies beside the data directory, which is the
    postmaster's working directory."""
    return run(work, url, Path(f"/proc/{postmaster}/cwd").resolve().parent / "log")


def main() -> int:
    return with_postgres("roundtrips", _run_on)


if __name__ == "__main__":
    raise SystemExit(main())
