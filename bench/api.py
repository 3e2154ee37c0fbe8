"""API throughput and latency: authorized GET /v1/grants and POST /v1/grants against `trustfabric serve`
(uvicorn, loopback, 2 workers), beside a bare FastAPI endpoint (same uvicorn, 2 workers) returning the
same JSON, measured in the same run by a load generator in separate processes.

Prints `<figure>: <value> <unit> (baseline <value> <unit>, ratio <r>)`, medians of RUNS runs of a closed
loop (CONNECTIONS connections sending back to back: the throughput, and the latency at saturation), then
`<figure>_at_50pct` lines: p50/p99 in an open loop, requests sent on a fixed schedule at half the
closed-loop throughput and timed from their scheduled send time (queueing is not hidden), beside the
bare endpoint at the same rate.
Goals: authorized reads >= 50% of the bare endpoint's throughput; p99 <= 25 ms at the measured rate.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
BIN = str(Path(sys.executable).parent / "trustfabric")
WORKERS = 2
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "8"))
LOAD_PROCESSES = 2
DURATION = float(os.environ.get("BENCH_SECONDS", "3"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SEED_GRANTS = 20
OPEN_SECONDS = float(os.environ.get("BENCH_OPEN_SECONDS", "5"))
OPEN_THREADS = int(os.environ.get("BENCH_OPEN_THREADS", "16"))  # connections per load process (open loop)
OPEN_FRACTION = 0.5  # the fixed offered rate, as a fraction of the closed-loop throughput
OPEN_WARMUP = 1.0  # seconds at the same rate before each open-loop figure, not counted (first use of
# each server thread builds its policy engines; that is not the steady state)

BARE_APP = textwrap.dedent('''
    import json, os, socket
    from fastapi import FastAPI, Request
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class NoDelayHttpTools(HttpToolsProtocol):
        """serve's parser, with the socket option serve sets (uvicorn --workers skips TCP_NODELAY)."""
        def connection_made(self, transport):
            super().connection_made(transport)
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    app = FastAPI()
    with open(os.environ["BENCH_GET_JSON"]) as fh:
        GET_BODY = json.load(fh)
    with open(os.environ["BENCH_POST_JSON"]) as fh:
        POST_BODY = json.load(fh)

    @app.get("/v1/grants")
    def grants() -> dict:
        return GET_BODY

    @app.post("/v1/grants", status_code=201)
    async def request_grant(request: Request) -> dict:
        await request.json()
        return POST_BODY
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not start")


def call(port: int, method: str, path: str, token: str | None = None, body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": "application/json", **(headers or {})}
    if token:
        h["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
    r = conn.getresponse()
    data = r.read()
    return r.status, json.loads(data) if data else None


def _send(conn: http.client.HTTPConnection, port: int, method: str, path: str, token: str,
          body: Any) -> tuple[http.client.HTTPConnection, str | None]:
    """One request on a keep-alive connection (a fresh Idempotency-Key per POST, and a body of its own when it
    has a justification: every grant request distinct): None, or what went wrong (a status of 400 or more
    with the start of its body, or a broken connection, which is replaced)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = None
    if body is not None:
        key = headers["Idempotency-Key"] = uuid.uuid4().hex
        payload = json.dumps({**body, "justification": f"{body['justification']} {key}"}
                             if isinstance(body, dict) and "justification" in body else body)
    try:
        conn.request(method, path, body=payload, headers=headers)
        r = conn.getresponse()
        answer = r.read()
        return conn, None if r.status < 400 else f"HTTP {r.status}: {answer[:200].decode(errors='replace')}"
    except OSError as exc:
        conn.close()
        return http.client.HTTPConnection("127.0.0.1", port, timeout=30), f"connection: {exc}"


class _Failures:
    """The failed requests of a load process: how many, and the first one's description (a bench that fails
    says why: a quota, a rate limit, a broken connection)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        self._lock = threading.Lock()

    def add(self, failure: str | None) -> None:
        if failure is not None:
            with self._lock:
                self.count += 1
                self.first = self.first or failure


def _check(failures: list[tuple[int, str | None]], total: int, method: str, path: str) -> None:
    count = sum(n for n, _ in failures)
    if count:
        first = next(f for n, f in failures if n)
        raise RuntimeError(f"{count} of {total} {method} {path} requests failed; the first: {first}")


Ports = int | list[int]  # one server, or replicas: connection i goes to ports[i % len(ports)]


class _Spread:
    """Hands each new connection the next port of a replica set (client-side balancing, like a TCP LB)."""

    def __init__(self, ports: Ports, offset: int = 0) -> None:
        self._ports = [ports] if isinstance(ports, int) else list(ports)
        self._next = offset
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            port = self._ports[self._next % len(self._ports)]
            self._next += 1
            return port


def _run_threads(loop: Any, threads: int) -> None:
    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _load_worker(ports: Ports, method: str, path: str, token: str, body: Any, deadline: float,
                 out: Any, threads: int, offset: int = 0) -> None:
    """Closed-loop load: `threads` keep-alive connections, each sending back-to-back until the deadline."""
    latencies: list[float] = []
    failures = _Failures()
    lock = threading.Lock()
    spread = _Spread(ports, offset)

    def loop() -> None:
        port = spread.next()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            conn, failure = _send(conn, port, method, path, token, body)
            mine.append(time.perf_counter() - t0)
            failures.add(failure)
        with lock:
            latencies.extend(mine)

    _run_threads(loop, threads)
    used = resource.getrusage(resource.RUSAGE_SELF)  # this forked process only: the client's own CPU
    out.put((latencies, (failures.count, failures.first), used.ru_utime + used.ru_stime))


def measure(port: Ports, method: str, path: str, token: str, body: Any = None) -> dict[str, float]:
    """Throughput (req/s), p50/p99/max (ms) over DURATION seconds from LOAD_PROCESSES processes, and the load
    generator's CPU per request (client_cpu_ms: user + system time of its processes / requests)."""
    q: Any = mp.get_context("fork").Queue()
    start = time.monotonic() + 0.3
    deadline = start + DURATION
    per_proc = max(1, CONNECTIONS // LOAD_PROCESSES)
    procs = [mp.get_context("fork").Process(target=_load_worker, args=(port, method, path, token, body, deadline,
                                                                       q, per_proc, i * per_proc))
             for i in range(LOAD_PROCESSES)]
    for p in procs:
        p.start()
    lat: list[float] = []
    failed: list[tuple[int, str | None]] = []
    cpu = 0.0
    for _ in procs:
        got, bad, used = q.get()
        lat.extend(got)
        failed.append(bad)
        cpu += used
    for p in procs:
        p.join()
    _check(failed, len(lat), method, path)
    lat.sort()
    return {"rps": len(lat) / DURATION, "p50": lat[len(lat) // 2] * 1000, "p99": lat[int(len(lat) * 0.99)] * 1000,
            "max": lat[-1] * 1000, "client_cpu_ms": cpu * 1000 / max(1, len(lat))}


def _open_worker(ports: Ports, method: str, path: str, token: str, body: Any, start: float, rate: float,
                 total: int, first: int, stride: int, out: Any, threads: int) -> None:
    """Open-loop load: request k (k = first, first + stride, ...) is due at start + k / rate, whatever the
    server did with the earlier ones; its latency runs from that due time to the end of the response, so
    time spent waiting for a free connection or behind a slow answer counts (no coordinated omission)."""
    latencies: list[float] = []
    failures = _Failures()
    lock = threading.Lock()
    counter = [first]
    spread = _Spread(ports, first * threads)

    def loop() -> None:
        port = spread.next()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        while True:
            with lock:
                k = counter[0]
                counter[0] += stride
            if k >= total:
                break
            due = start + k / rate
            delay = due - time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
            if delay > 0:
                time.sleep(delay)
            conn, failure = _send(conn, port, method, path, token, body)
            mine.append(time.monotonic() - due)
            failures.add(failure)
        with lock:
            latencies.extend(mine)

    _run_threads(loop, threads)
    out.put((latencies, (failures.count, failures.first)))


def measure_open(port: Ports, method: str, path: str, token: str, rate: float, body: Any = None,
                 seconds: float | None = None) -> dict[str, float]:
    """p50/p99 (ms) at a fixed offered `rate` (req/s) for OPEN_SECONDS, from LOAD_PROCESSES processes,
    after OPEN_WARMUP seconds at the same rate that are not counted."""
    if seconds is None and OPEN_WARMUP > 0:
        measure_open(port, method, path, token, rate, body, seconds=OPEN_WARMUP)
    ctx = mp.get_context("fork")
    q: Any = ctx.Queue()
    total = max(1, int(rate * (OPEN_SECONDS if seconds is None else seconds)))
    start = time.monotonic() + 0.3
    procs = [ctx.Process(target=_open_worker, args=(port, method, path, token, body, start, rate, total, i,
                                                    LOAD_PROCESSES, q, OPEN_THREADS))
             for i in range(LOAD_PROCESSES)]
    for p in procs:
        p.start()
    lat: list[float] = []
    failed: list[tuple[int, str | None]] = []
    for _ in procs:
        got, bad = q.get()
        lat.extend(got)
        failed.append(bad)
    for p in procs:
        p.join()
    _check(failed, len(lat), method, f"{path} (open loop)")
    lat.sort()
    return {"rate": rate, "n": len(lat), "p50": lat[len(lat) // 2] * 1000, "p99": lat[int(len(lat) * 0.99)] * 1000,
            "p999": lat[int(len(lat) * 0.999)] * 1000, "max": lat[-1] * 1000}


def open_line(figure: str, pct: str, value: float, base: float) -> str:
    return (f"{figure}: {value:.1f} ms (baseline bare {pct} at the same rate {base:.1f} ms, "
            f"ratio {value / base:.2f})")


def percentile(values: list[float], q: float) -> float:
    """The value below which a fraction `q` of `values` lies (nearest rank, the one above); 0 when none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def median_runs(fn: Any) -> dict[str, float]:
    runs = [fn() for _ in range(RUNS)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def line(figure: str, value: float, base: float, unit: str) -> str:
    return f"{figure}: {value:.1f} {unit} (baseline {base:.1f} {unit}, ratio {value / base:.2f})"


def interleaved(run: Any, on: int, off: int) -> tuple[dict[str, float], dict[str, float]]:
    """Medians of RUNS runs against each server, alternating (a load change hits both alike)."""
    a, b = [], []
    for _ in range(RUNS):
        a.append(run(on))
        b.append(run(off))
    return ({k: statistics.median(r[k] for r in a) for k in a[0]},
            {k: statistics.median(r[k] for r in b) for k in b[0]})


def cache_figures(env: dict[str, str], work: Path, port: int, token: str, grant: Any,
                  procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """Each request-path cache (api/caches.py) off in turn, against the same server with every cache on,
    measured back to back (the POSTs add grants, so each pair shares the same database size): a cache
    whose `_off_` figure is not clearly below its baseline does not pay."""
    # the names, from api/caches.py (this script is itself named api.py, so ask a fresh interpreter)
    CACHES = subprocess.run([sys.executable, "-c", "from api.caches import CACHES; print(' '.join(CACHES))"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    out = [f"caches: each of {', '.join(CACHES)} switched off (TRUSTFABRIC_CACHE_OFF) vs all on, "
           f"GET then POST /v1/grants, median of {RUNS} runs x {DURATION:g} s each, on/off runs alternating"]
    for name in CACHES:
        off_port = free_port()
        proc = subprocess.Popen([BIN, "serve", "--port", str(off_port), "--workers", str(WORKERS), "--log-level",
                                 "warning"], env=dict(env, TRUSTFABRIC_CACHE_OFF=name), cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_healthy(off_port, "/healthz", proc)
        get_on, get_off = interleaved(lambda p: measure(p, "GET", "/v1/grants", token), port, off_port)
        post_on, post_off = interleaved(lambda p: measure(p, "POST", "/v1/grants", token, grant), port, off_port)
        out.append(line(f"cache_{name}_off_get_throughput", get_off["rps"], get_on["rps"], "req/s"))
        out.append(line(f"cache_{name}_off_post_throughput", post_off["rps"], post_on["rps"], "req/s"))
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
    return out


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="tf-bench-api-"))
    env = bench_env(work, TRUSTFABRIC_SWEEP_INTERVAL_SECONDS="30", TRUSTFABRIC_QUOTA_PENDING="0",
                    TRUSTFABRIC_QUOTA_GRANTS="0")  # every POST makes a grant: no quota may refuse the load
    procs: list[subprocess.Popen[bytes]] = []
    progress = Progress("api")
    try:
        progress.step("starting the servers, seeding grants")
        subprocess.run([BIN, "init", "--trust-domain", "bench.example"], env=env, cwd=work, check=True,
                       capture_output=True)

        def token(*args: str) -> str:
            return mint(env, work, *args)

        port = free_port()
        procs.append(subprocess.Popen([BIN, "serve", "--port", str(port), "--workers", str(WORKERS),
                                       "--log-level", "warning"], env=env, cwd=work, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        wait_healthy(port, "/healthz", procs[-1])
        admin = token("--role", "admin")
        seed_tenants(port, admin)
        acme = token("--role", "tenant-admin", "--tenant", "acme")
        grant = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
                 "ttl_seconds": 3600, "justification": "bench"}
        post_body: Any = None
        for _ in range(SEED_GRANTS):
            status, post_body = call(port, "POST", "/v1/grants", acme, grant)
            assert status == 201, post_body
        status, get_body = call(port, "GET", "/v1/grants", acme)
        assert status == 200 and len(get_body["items"]) == SEED_GRANTS

        (work / "get.json").write_text(json.dumps(get_body))
        (work / "post.json").write_text(json.dumps(post_body))
        (work / "tf_bare_app.py").write_text(BARE_APP)
        bare_port = free_port()
        bare_env = dict(env, BENCH_GET_JSON=str(work / "get.json"), BENCH_POST_JSON=str(work / "post.json"))
        procs.append(subprocess.Popen([sys.executable, "-m", "uvicorn", "tf_bare_app:app", "--app-dir", str(work),
                                       "--host", "127.0.0.1", "--port", str(bare_port), "--workers", str(WORKERS),
                                       "--log-level", "warning", "--http", "tf_bare_app:NoDelayHttpTools"],
                                      env=bare_env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(bare_port, "/v1/grants", procs[-1])

        # the same data served with the read caches off: every request queries the database
        cold_port = free_port()
        procs.append(subprocess.Popen([BIN, "serve", "--port", str(cold_port), "--workers", str(WORKERS),
                                       "--log-level", "warning"], env=dict(env, TRUSTFABRIC_READ_CACHE="0"),
                                      cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_healthy(cold_port, "/healthz", procs[-1])

        progress.step("closed loop: GET and POST /v1/grants, trustfabric, uncached and bare")
        get_tf = median_runs(lambda: measure(port, "GET", "/v1/grants", acme))
        get_cold = median_runs(lambda: measure(cold_port, "GET", "/v1/grants", acme))
        get_bare = median_runs(lambda: measure(bare_port, "GET", "/v1/grants", acme))
        post_tf = median_runs(lambda: measure(port, "POST", "/v1/grants", acme, grant))
        post_bare = median_runs(lambda: measure(bare_port, "POST", "/v1/grants", acme, grant))
        # open loop at a fixed offered rate: half of what the closed loop reached on trustfabric
        post_rate = OPEN_FRACTION * post_tf["rps"]
        get_rate = OPEN_FRACTION * get_tf["rps"]
        progress.step("open loop at half the closed-loop rate")
        post_open = measure_open(port, "POST", "/v1/grants", acme, post_rate, grant)
        post_open_bare = measure_open(bare_port, "POST", "/v1/grants", acme, post_rate, grant)
        get_open = measure_open(port, "GET", "/v1/grants", acme, get_rate)
        get_open_bare = measure_open(bare_port, "GET", "/v1/grants", acme, get_rate)

        print(f"scale: uvicorn {WORKERS} workers on loopback, {CONNECTIONS} keep-alive connections from "
              f"{LOAD_PROCESSES} load processes, {SEED_GRANTS} grants listed per GET, SQLite, "
              f"median of {RUNS} runs x {DURATION:g} s")
        print(line("get_grants_throughput", get_tf["rps"], get_bare["rps"], "req/s"))
        print(line("get_grants_p50", get_tf["p50"], get_bare["p50"], "ms"))
        print(line("get_grants_p99", get_tf["p99"], get_bare["p99"], "ms"))
        print(line("get_grants_uncached_throughput", get_cold["rps"], get_bare["rps"], "req/s"))
        print(line("get_grants_uncached_p99", get_cold["p99"], get_bare["p99"], "ms"))
        print(line("post_grants_throughput", post_tf["rps"], post_bare["rps"], "req/s"))
        print(line("post_grants_p50", post_tf["p50"], post_bare["p50"], "ms"))
        print(line("post_grants_p99", post_tf["p99"], post_bare["p99"], "ms"))
        pct = round(OPEN_FRACTION * 100)
        print(f"open loop (requests sent on a fixed schedule, latency from each request's scheduled send "
              f"time, so queueing is counted; {OPEN_SECONDS:g} s per figure after {OPEN_WARMUP:g} s of warm-up, "
              f"up to {OPEN_THREADS * LOAD_PROCESSES} "
              f"connections): POST at {post_rate:.0f} req/s = {pct}% of closed-loop post_grants_throughput "
              f"({post_open['n']:.0f} requests), GET at {get_rate:.0f} req/s = {pct}% of closed-loop "
              f"get_grants_throughput ({get_open['n']:.0f} requests)")
        print(open_line(f"post_grants_p50_at_{pct}pct", "p50", post_open["p50"], post_open_bare["p50"]))
        print(open_line(f"post_grants_p99_at_{pct}pct", "p99", post_open["p99"], post_open_bare["p99"]))
        print(open_line(f"get_grants_p50_at_{pct}pct", "p50", get_open["p50"], get_open_bare["p50"]))
        print(open_line(f"get_grants_p99_at_{pct}pct", "p99", get_open["p99"], get_open_bare["p99"]))
        progress.step("each request-path cache off and on")
        for figure in cache_figures(env, work, port, acme, grant, procs):
            print(figure, flush=True)
        read_ok = get_tf["rps"] >= 0.5 * get_bare["rps"]
        print(f"goals: reads >= 50% of bare: {'met' if read_ok else 'NOT met'}; "
              f"GET p99 <= 25 ms: closed loop {'met' if get_tf['p99'] <= 25 else 'NOT met'}, "
              f"at {pct}% {'met' if get_open['p99'] <= 25 else 'NOT met'}; "
              f"POST p99 <= 25 ms: closed loop {'met' if post_tf['p99'] <= 25 else 'NOT met'}, "
              f"at {pct}% {'met' if post_open['p99'] <= 25 else 'NOT met'}")
        return 0
    finally:
        progress.done()
        stop_all(procs, work)


def seed_tenants(port: int, admin: str) -> None:
    """acme/web and globex/api, each exposing tcp/443: what the grant benches request flows between."""
    for slug in ("acme", "globex"):
        assert call(port, "POST", "/v1/tenants", admin, {"slug": slug, "display_name": slug})[0] == 201
    assert call(port, "POST", "/v1/tenants/acme/groups", admin,
                {"name": "web", "ports": [{"proto": "tcp", "port": 443}]})[0] == 201
    assert call(port, "POST", "/v1/tenants/globex/groups", admin,
                {"name": "api", "ports": [{"proto": "tcp", "port": 443}]})[0] == 201


def bench_env(work: Path, **extra: str) -> dict[str, str]:
    """The environment a bench runs `trustfabric` in: its own data directory, development mode (the policy
    activates unsigned), no rate limits (the load comes from one address and a few principals)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    env.update({"TRUSTFABRIC_HOME": str(work / "home"), "TRUSTFABRIC_MODE": "development",
                "TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "0", "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND": "0", **extra})
    return env


def mint(env: dict[str, str], work: Path, *args: str) -> str:
    """An API token from `trustfabric token create ARGS` (an hour)."""
    out = subprocess.run([BIN, "token", "create", *args, "--ttl", "1h"], env=env, cwd=work, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def stop_all(procs: list[subprocess.Popen[bytes]], work: Path) -> None:
    """Stop the servers a bench started (SIGINT, then kill after 15 s) and remove its data directory."""
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    sys.exit(main())
