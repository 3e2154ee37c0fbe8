"""Grants that become active at once (POST /v1/grants to an auto-approved group) on 3 replicas of `trustfabric
serve` on one PostgreSQL (its own cluster, fsync on): the deadlocks PostgreSQL detected and the tail of the
grants' latency, where a lock-order deadlock shows as a stall of deadlock_timeout (1 s) or of the 20 ms lock
timeout a grant written under the audit head's lock waits for at most.

Why: an active grant's INSERT also updates the one policy data version row (schema step 9's trigger), a row lock.
A group commit's batch takes its members' row locks before the audit head's lock; a member that joins it after
the head's lock (late) must take none, or the two are taken the other way round from every other write
transaction (store/groupcommit.py).

Loads (BENCH_LOADS), one after the other, each BENCH_SECONDS (30) long, closed loop, 8 keep-alive connections spread
over the replicas connection by connection (as a TCP load balancer would), half of the grant ones (BENCH_KEYED)
sending an Idempotency-Key:
  active:  every connection requests active grants;
  mixed:   half request active grants, half renew an X.509-SVID (the bulk of a control plane's writes): the batches
           of renewals take the head's lock without the data version's row, so the late active grants met it;
  pending: (not by default) every connection requests a pending grant, to compare.
The grants live BENCH_GRANT_TTL (1 s) and the sweeper runs every BENCH_SWEEP_SECONDS (0.2 s): every active grant
changes the policy data, so the next decision on every replica builds the data document again, from every grant
still stored as active; grants of an hour piled up by thousands within a run, and those rebuilds were then most
of each request.
Per load: the grants' max against their p50, p99, p99.9 (ms), grants/s and renewals/s, the CPU per request of the
replicas (with their children) and of PostgreSQL's processes (an active grant's against a pending one's: what each
change of the policy data costs), and from PostgreSQL the deadlocks (pg_stat_database.deadlocks) and its log's
`deadlock detected` and `lock timeout` errors. BENCH_PY_SPY=<dir>: py-spy (installed beside the interpreter, not a
requirement) records the first replica through each load, as collapsed stacks in <dir>/<load>.txt.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import call, percentile, seed_tenants
from bench.progress import Progress
from bench.replicas import BIN, cpu_seconds, mint, renewal, with_postgres
from tests.conftest import _free_port
from tests.servers import replica_env, serve_replicas

REPLICAS = 3
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "8"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "30"))
LOADS = os.environ.get("BENCH_LOADS", "active,mixed").split(",")
KEYED = float(os.environ.get("BENCH_KEYED", "0.5"))  # the share of connections sending an Idempotency-Key
TTL = int(os.environ.get("BENCH_GRANT_TTL", "1"))
SWEEP = os.environ.get("BENCH_SWEEP_SECONDS", "0.2")
AUTO = {"grants.trustfabric.io/auto-approve": "true"}
GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "auto", "proto": "tcp", "ports": [443],
         "ttl_seconds": TTL, "justification": "bench"}
Plan = list[tuple[str, dict[str, Any], "str | None"]]  # per connection: path, body, the grant state expected


def _worker(port: int, path: str, token: str, body: dict[str, Any], expect: str | None, keyed: bool, deadline: float,
            out: Any) -> None:
    """One keep-alive connection sending back to back until `deadline`: its latencies (s) and failures (a grant
    in another state than `expect` is one; `expired` is not: an active grant answered after its TTL, a stall)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies: list[float] = []
    failures: list[str] = []
    while time.monotonic() < deadline:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        payload = body
        if path == "/v1/grants":
            tag = uuid.uuid4().hex
            payload = {**body, "justification": f"bench {tag}"}
            if keyed:
                headers["Idempotency-Key"] = tag
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, body=json.dumps(payload), headers=headers)
            r = conn.getresponse()
            answer = r.read()
        except OSError as exc:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            failures.append(f"connection: {exc}")
            continue
        latencies.append(time.perf_counter() - t0)
        if r.status >= 400:
            failures.append(f"HTTP {r.status}: {answer[:200].decode(errors='replace')}")
        elif expect is not None and json.loads(answer).get("state") not in (expect, "expired"):
            failures.append(f"not {expect}: {answer[:200].decode(errors='replace')}")
    out.put((path, latencies, failures))


def _keyed(j: int) -> bool:
    """Whether the j-th grant connection sends Idempotency-Keys: KEYED of them, spread evenly (0.5: every other)."""
    return int((j + 1) * KEYED) > int(j * KEYED)


def _load(ports: list[int], plan: Plan, token: str) -> dict[str, list[float]]:
    """Run `plan` for SECONDS, one process per connection (connection i on replica i % 3; KEYED of the grant ones
    keyed): the latencies (s) per path."""
    ctx = mp.get_context("fork")
    q: Any = ctx.Queue()
    deadline = time.monotonic() + 0.5 + SECONDS
    grant_index = [sum(entry[0] == "/v1/grants" for entry in plan[:i]) for i in range(len(plan))]
    procs = [ctx.Process(target=_worker, args=(ports[i % len(ports)], path, token, body, expect,
                                               _keyed(grant_index[i]), deadline, q))
             for i, (path, body, expect) in enumerate(plan)]
    for p in procs:
        p.start()
    got: dict[str, list[float]] = {}
    failures: list[str] = []
    for _ in procs:
        path, latencies, failed = q.get()
        got.setdefault(path, []).extend(latencies)
        failures.extend(failed)
    for p in procs:
        p.join()
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed; the first: {failures[0]}")
    return got


def _deadlocks(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def _log_counts(log: Path) -> tuple[int, int]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("deadlock detected"), text.count("lock timeout")


def run_with_log(work: Path, database_url: str, log: Path, postmaster: int | None = None) -> list[str]:
    progress = Progress("grant_locks")
    env = replica_env(dict(os.environ), home=work / "home", database_url=database_url,
                      TRUSTFABRIC_SWEEP_INTERVAL_SECONDS=SWEEP, TRUSTFABRIC_QUOTA_PENDING="0",
                      TRUSTFABRIC_QUOTA_GRANTS="0")  # no quota: a grant takes no tenant row lock
    ports = [_free_port() for _ in range(REPLICAS)]
    progress.step(f"starting {REPLICAS} replicas")
    lines = [f"# scale: {REPLICAS} replicas x 1 uvicorn worker, PostgreSQL (own cluster, fsync on), loopback, "
             f"{CONNECTIONS} keep-alive connections (one load process each; {KEYED:.0%} of the grant ones with an "
             f"Idempotency-Key), closed loop, {SECONDS:g} s per load, grants of {TTL} s swept every {SWEEP} s; "
             f"{os.cpu_count()} cores shared by servers, database and load"]
    with serve_replicas(BIN, REPLICAS, env=env, cwd=work, ports=ports) as replicas:
        servers = [r.proc.pid for r in replicas]
        admin = mint(env, work, "--role", "admin")
        seed_tenants(ports[0], admin)
        assert call(ports[0], "POST", "/v1/tenants/acme/groups/web/workloads", admin, {"name": "w1"})[0] == 201
        assert call(ports[0], "POST", "/v1/tenants/globex/groups", admin,
                    {"name": "auto", "labels": AUTO, "ports": [{"proto": "tcp", "port": 443}]})[0] == 201
        acme = mint(env, work, "--role", "tenant-admin", "--tenant", "acme")
        for port in ports:  # each replica's first decision builds its engines: not the steady state
            status, body = call(port, "POST", "/v1/grants", acme, GRANT)
            assert status == 201 and body["state"] == "active", body
        renew = renewal()
        for load in LOADS:
            plan: Plan = {
                "active": [("/v1/grants", GRANT, "active")] * CONNECTIONS,
                "mixed": [("/v1/grants", GRANT, "active"), ("/v1/svids/x509", renew, None)] * (CONNECTIONS // 2),
                "pending": [("/v1/grants", {**GRANT, "dst_group": "api"}, "pending")] * CONNECTIONS,  # to compare
            }[load]
            progress.step(f"{load}: {SECONDS:g} s")
            deadlocks, (detected, timeouts) = _deadlocks(database_url), _log_counts(log)
            load_avg = os.getloadavg()[0]
            cpu0 = cpu_seconds(servers), cpu_seconds([postmaster]) if postmaster else 0.0
            spy = _py_spy(servers[0], load)
            got = _load(ports, plan, acme)
            cpu1 = cpu_seconds(servers), cpu_seconds([postmaster]) if postmaster else 0.0
            if spy is not None:
                spy.wait()
            deadlocks2, (detected2, timeouts2) = _deadlocks(database_url), _log_counts(log)
            grants = sorted(got["/v1/grants"])
            ms = [v * 1000 for v in grants]
            renewals = len(got.get("/v1/svids/x509", []))
            requests = max(1, len(grants) + renewals)
            p50 = percentile(ms, 0.5)
            lines.append(
                f"post_grants_{load}_max_3_replicas: {ms[-1]:.0f} ms (baseline p50 {p50:.1f} ms, ratio "
                f"{ms[-1] / p50:.1f}); p99 {percentile(ms, 0.99):.1f} ms, p99.9 {percentile(ms, 0.999):.1f} ms, "
                f"{sum(v > 100 for v in ms)} over 100 ms, {len(ms) / SECONDS:.0f} grants/s"
                + (f", {renewals / SECONDS:.0f} renewals/s" if renewals else "")
                + f"; CPU per request: replicas {(cpu1[0] - cpu0[0]) * 1000 / requests:.1f} ms, PostgreSQL "
                f"{(cpu1[1] - cpu0[1]) * 1000 / requests:.1f} ms ({requests} requests)"
                + f"; deadlocks {deadlocks2 - deadlocks} (log: {detected2 - detected} deadlock detected, "
                f"{timeouts2 - timeouts} lock timeout); load average {load_avg:.1f} at its start")
            progress.step(lines[-1])
    if os.environ.get("BENCH_PG_LOG_COPY"):  # PostgreSQL's log, to read what it says (the cluster is removed)
        shutil.copy(log, os.environ["BENCH_PG_LOG_COPY"])
    progress.done()
    return lines


def _py_spy(pid: int, load: str) -> Any:
    """With BENCH_PY_SPY=<dir>: py-spy records the first replica through the load (a speedscope profile per load,
    native frames included, idle threads left out), to see where its CPU goes."""
    out = os.environ.get("BENCH_PY_SPY")
    if not out:
        return None
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(SECONDS)), "--rate", "200",
                             "--format", "raw", "--output", str(Path(out) / f"{load}.txt"), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    def run(work: Path, database_url: str, postmaster: int) -> list[str]:
        import psycopg

        with psycopg.connect(database_url, autocommit=True) as conn:  # the cluster's log is beside its data
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        return run_with_log(work, database_url, Path(str(row[0])).parent / "log", postmaster)

    return with_postgres("grant_locks", run)


if __name__ == "__main__":
    sys.exit(main())
