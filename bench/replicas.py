"""POST /v1/grants against 3 replicas of `trustfabric serve` (one process each) on one PostgreSQL (its own
cluster, fsync on), beside the same load on 1 of them; then a long open-loop run for the tail and the
maximum latency (the 0.35-1.2 s stalls issue 11 reports).

Closed loop: CONNECTIONS keep-alive connections (bench/api.py's load generator, LOAD_PROCESSES processes)
sending back to back, spread over the replicas connection by connection as a TCP load balancer would;
medians of RUNS runs of DURATION seconds. Open loop: requests sent on a fixed schedule at half the 3-replica
closed-loop throughput for STALL_SECONDS, each timed from its scheduled send time (queueing counted).
Goal (issue 11): POST /v1/grants p99 <= 25 ms closed loop at 8 connections on PostgreSQL with 3 replicas.

CPU per grant request, sampled around each closed-loop run (user + system time / requests): the replicas'
(every replica, also in the 1-replica run: the others still poll; and apart, their event loops' share, where
the HTTP parsing and the ASGI stack run), PostgreSQL's (the postmaster and its backends) and the load
generator's. It depends far less than the wall figures on what else the shared cores run, so it is the figure
to compare before/after (it still grows by up to ~1.5x with their load: threads running at once on this
machine's 2 vCPUs slow each other, so compare runs made back to back); on 2 cores a closed loop of 8
connections waits about 8 x (total CPU per request) / 2, so the p99 goal needs about 3 ms in all. Every request
is a distinct grant (its own Idempotency-Key and justification).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import (
    CONNECTIONS,
    DURATION,
    LOAD_PROCESSES,
    RUNS,
    call,
    measure,
    measure_open,
    median_runs,
    seed_tenants,
)
from bench.audit import DurablePostgres
from bench.progress import Progress
from tests.conftest import _free_port
from tests.servers import replica_env, serve_replicas

BIN = str(Path(sys.executable).parent / "trustfabric")
REPLICAS = 3
STALL_SECONDS = float(os.environ.get("BENCH_STALL_SECONDS", "120"))  # the issue asks for a long run: 2 minutes
GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
         "ttl_seconds": 3600, "justification": "bench"}


def mint(env: dict[str, str], work: Path, *args: str) -> str:
    out = subprocess.run([BIN, "token", "create", *args, "--ttl", "2h"], env=env, cwd=work, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def seed(port: int, admin: str) -> None:
    seed_tenants(port, admin)
    assert call(port, "POST", "/v1/tenants/acme/groups/web/workloads", admin, {"name": "w1"})[0] == 201


def renewal() -> dict[str, Any]:
    """The body of an SVID renewal: a workload's CSR (the same key each time, as an agent reusing its key)."""
    from bench.pki import _csr

    return {"csr": _csr().decode(), "tenant": "acme", "group": "web", "workload": "w1", "ttl_seconds": 3600}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and all their descendants (the live ones)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in (root, *root.children(recursive=True)):
                t = proc.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def loop_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes' main threads: a replica's event loop, where uvicorn parses
    every request and the ASGI stack runs (the route's own work and the group commit run on other threads)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            main = [t for t in psutil.Process(pid).threads() if t.id == pid]
        except psutil.NoSuchProcess:
            continue
        total += sum(t.user_time + t.system_time for t in main)
    return total


def with_cpu(servers: list[int], database: list[int], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`fn()`'s figures plus the servers' and the database's CPU per request (ms), sampled around it: CPU time
    per request depends far less than latency on what else the shared cores run, so before/after compare on it
    (it still grows with their load: threads running at once on this machine's 2 vCPUs slow each other)."""
    s0, d0, l0 = cpu_seconds(servers), cpu_seconds(database), loop_cpu_seconds(servers)
    out = fn()
    s1, d1, l1 = cpu_seconds(servers), cpu_seconds(database), loop_cpu_seconds(servers)
    n = max(1.0, out["rps"] * DURATION)
    return {**out, "server_cpu_ms": (s1 - s0) * 1000 / n, "db_cpu_ms": (d1 - d0) * 1000 / n,
            "loop_cpu_ms": (l1 - l0) * 1000 / n}


def fmt(figure: str, value: float, unit: str, base_name: str, base: float) -> str:
    return f"{figure}: {value:.1f} {unit} (baseline {base_name} {base:.1f} {unit}, ratio {value / base:.2f})"


def run(work: Path, database_url: str, database_pid: int) -> list[str]:
    progress = Progress("replicas")
    env = replica_env(dict(os.environ), home=work / "home", database_url=database_url,
                      TRUSTFABRIC_SWEEP_INTERVAL_SECONDS="30", TRUSTFABRIC_QUOTA_PENDING="0",
                      TRUSTFABRIC_QUOTA_GRANTS="0")  # every POST makes a grant: no quota may refuse the load
    ports = [_free_port() for _ in range(REPLICAS)]
    progress.step(f"starting {REPLICAS} replicas")
    with serve_replicas(BIN, REPLICAS, env=env, cwd=work, ports=ports) as replicas:
        pids, db = [r.proc.pid for r in replicas], [database_pid]
        admin = mint(env, work, "--role", "admin")
        seed(ports[0], admin)
        acme = mint(env, work, "--role", "tenant-admin", "--tenant", "acme")
        for port in ports:  # each replica's first decision builds its engines: not the steady state
            assert call(port, "POST", "/v1/grants", acme, GRANT)[0] == 201
        progress.step("closed loop: POST /v1/grants on 3 replicas and on 1")
        three: dict[str, Any] = median_runs(
            lambda: with_cpu(pids, db, lambda: measure(ports, "POST", "/v1/grants", acme, GRANT)))
        one: dict[str, Any] = median_runs(
            lambda: with_cpu(pids, db, lambda: measure(ports[0], "POST", "/v1/grants", acme, GRANT)))
        body = renewal()
        progress.step("closed loop: POST /v1/svids/x509 on 3 replicas and on 1")
        svid3: dict[str, Any] = median_runs(lambda: measure(ports, "POST", "/v1/svids/x509", acme, body))
        svid1: dict[str, Any] = median_runs(lambda: measure(ports[0], "POST", "/v1/svids/x509", acme, body))
        rate = 0.5 * three["rps"]
        progress.step(f"open loop: {STALL_SECONDS:g} s at {rate:.0f} req/s")
        tail = measure_open(ports, "POST", "/v1/grants", acme, rate, GRANT, seconds=STALL_SECONDS)
    progress.done()
    scale = (f"# scale: {REPLICAS} replicas x 1 uvicorn worker, PostgreSQL (own cluster, fsync on), loopback, "
             f"{CONNECTIONS} keep-alive connections from {LOAD_PROCESSES} load processes spread over the replicas, "
             f"median of {RUNS} runs x {DURATION:g} s; {os.cpu_count()} cores shared by servers, database and load")
    return [
        scale,
        fmt("post_grants_throughput_3_replicas", three["rps"], "req/s", "1 replica", one["rps"]),
        fmt("post_grants_p50_3_replicas", three["p50"], "ms", "1 replica", one["p50"]),
        fmt("post_grants_p99_3_replicas", three["p99"], "ms", "1 replica", one["p99"]),
        fmt("post_grants_p99_3_replicas vs goal", three["p99"], "ms", "goal", 25.0),
        fmt("post_grants_server_cpu_per_request_3_replicas", three["server_cpu_ms"], "ms", "1 replica",
            one["server_cpu_ms"]),
        fmt("post_grants_server_event_loop_cpu_per_request_3_replicas", three["loop_cpu_ms"], "ms", "1 replica",
            one["loop_cpu_ms"]),
        fmt("post_grants_db_cpu_per_request_3_replicas", three["db_cpu_ms"], "ms", "1 replica", one["db_cpu_ms"]),
        fmt("post_grants_client_cpu_per_request_3_replicas", three["client_cpu_ms"], "ms", "1 replica",
            one["client_cpu_ms"]),
        f"post_grants_total_cpu_per_request_3_replicas: "
        f"{three['server_cpu_ms'] + three['db_cpu_ms'] + three['client_cpu_ms']:.2f} ms "
        f"(server + database + client; the goal needs about 3 ms on 2 cores)",
        f"post_grants_max_closed_loop: {three['max']:.0f} ms (3 replicas), {one['max']:.0f} ms (1 replica)",
        f"open loop, {STALL_SECONDS:g} s at {rate:.0f} req/s (50% of the 3-replica closed loop), {tail['n']:.0f} "
        f"requests: p50 {tail['p50']:.1f} ms, p99 {tail['p99']:.1f} ms, p99.9 {tail['p999']:.1f} ms, "
        f"max {tail['max']:.0f} ms",
        fmt("svid_renewals_throughput_3_replicas", svid3["rps"], "req/s", "1 replica", svid1["rps"]),
        fmt("svid_renewals_p99_3_replicas", svid3["p99"], "ms", "1 replica", svid1["p99"]),
        f"svid renewals per hour per replica (capacity, 1 replica closed loop x 3600): {svid1['rps'] * 3600:,.0f}",
        f"goal POST /v1/grants p99 <= 25 ms, 8 connections, 3 replicas on PostgreSQL: "
        f"{'met' if three['p99'] <= 25 else 'NOT met'} ({three['p99']:.1f} ms)",
    ]


def with_postgres(name: str, run_on: Callable[[Path, str, int], list[str]]) -> int:
    """Run `run_on(work directory, PostgreSQL URL)` on a durable cluster of its own and print its lines; the
    cluster and the directory are removed whatever happens (skipped, and said, without PostgreSQL)."""
    work = Path(tempfile.mkdtemp(prefix=f"tf-bench-{name}-"))
    try:
        try:
            pg = DurablePostgres()
        except (RuntimeError, subprocess.CalledProcessError, KeyError, LookupError) as exc:
            print(f"{name}: skipped, no PostgreSQL ({exc})")
            return 0
        try:
            postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
            lines = run_on(work, pg.url, postmaster)
        finally:
            pg.stop()
        for line in lines:
            print(line, flush=True)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    return with_postgres("replicas", run)


if __name__ == "__main__":
    sys.exit(main())
