"""End-to-end propagation through real node agents (root; without it the benchmark says so and exits 0).

1. Grant to wire: a generated lab fabric of N GPU nodes (N = 1, 10, 50; lab.generate: 16 nodes per leaf,
   two spines) built in agent mode, the same fabric imported into a real server (TLS on 127.0.0.1, the
   reconciler running), one agent per node and per leaf (threads of this process running the real agent
   code). Per grant: a tenant requests it, the destination tenant approves it through the API, and the clock
   runs from the approve call to the first TCP connection that completes through the lab (connects retried
   every CONNECT_TIMEOUT); then it is revoked and the path is seen closed before the next. p50 / p99 over
   GRANTS grants (goal at 50 agents: p99 <= 1 s), each beside baselines of the same run: the server-side
   publish time (approve call to the source NIC's new desired version in the database) and a bare TCP
   connect over an open path.
2. 1,000 simulated agents: protocol-level clients (no namespaces; one mTLS client with its own node SVID
   each, asyncio in this process) long-poll their device's rule set and report status against the server
   (a fabric of 1,000 nodes), while a grant is approved and revoked every second: p99 of a conditional
   rule-set fetch (304, or 200 with the IR) vs a plain GET /healthz on the same connections, errors
   (goal 0), and the server's CPU (every thread of this process but the clients' event loop, the main
   thread) per second of the run.
3. Agent CPU and memory: one agent process's worth, measured on a node agent thread group of the 50-agent
   run at idle and during grant churn (CPU seconds per second from /proc/self/task, summed over the agent's
   threads plus their ovs-ofctl / ip / nft child processes; memory: the process's RSS growth per agent,
   i.e. (RSS with agents - RSS before) / agents).

Run: sudo .venv/bin/python bench/propagation.py   (BENCH_GRANTS, default 20; BENCH_SCALES, default 1,10,50;
BENCH_SIM_AGENTS, default 1000)
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import shutil
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.device_loop import LoopSettings  # noqa: E402
from lab import build, operations, state  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.generate import fabric_yaml  # noqa: E402
from lab.probe import Endpoint, connect, endpoint, listening  # noqa: E402

GRANTS = int(os.environ.get("BENCH_GRANTS", "20"))
SCALES = [int(x) for x in os.environ.get("BENCH_SCALES", "1,10,50").split(",")]
SIM_AGENTS = int(os.environ.get("BENCH_SIM_AGENTS", "1000"))
SIM_SECONDS = float(os.environ.get("BENCH_SIM_SECONDS", "20"))
CONNECT_TIMEOUT = 0.02
TD = "bench.example"
# a real deployment checks drift every 2 s per device on its own node; here every agent shares two cores
# with the lab and the server, so the benchmark's agents check every 10 s (stated in the output)
LOOP = LoopSettings(wait=30, drift_every=10.0, report_every=10.0)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def line(figure: str, value: float, unit: str, base: float, note: str = "") -> None:
    ratio = value / base if base else float("inf")
    print(f"{figure}: {value:.4g} {unit} (baseline {note}{base:.4g} {unit}, ratio {ratio:.3g})", flush=True)


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return False


def thread_cpu(names: Callable[[str], bool], *, main: bool = True) -> float:
    """CPU seconds (user + system) of this process's Python threads whose name `names` accepts (`main`: the
    main thread may count), read from /proc by their native ids (the kernel does not know Python's names)."""
    tick = os.sysconf("SC_CLK_TCK")
    wanted = {t.native_id for t in threading.enumerate() if names(t.name) and t.native_id is not None
              and (main or t is not threading.main_thread())}
    total = 0
    for tid in wanted:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def children_cpu() -> float:
    """CPU seconds of the finished child processes (the agents' ovs-ofctl, ip and nft runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def agents_cpu() -> float:
    return thread_cpu(lambda n: n.startswith("agent-")) + children_cpu()


def rss_mb() -> float:
    for ln in Path("/proc/self/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------- 1. grant to wire

def grant_pairs(st: dict[str, Any], tenants: int = 5) -> list[tuple[str, str, Endpoint, Endpoint]]:
    """(src tenant, dst tenant, a src train workload, a dst data workload) for cross-tenant pairs that no
    policy allows yet (the file's grants are not imported), the endpoints on different nodes when possible."""
    eps = {k: endpoint(st, k) for k in st["workloads"]}
    out = []
    for a in range(tenants):
        for b in range(tenants):
            if a == b:
                continue
            srcs = [e for k, e in sorted(eps.items()) if k.startswith(f"t{a}/train/")]
            dsts = [e for k, e in sorted(eps.items()) if k.startswith(f"t{b}/data/")]
            if srcs and dsts:
                far = [d for d in dsts if d.node != srcs[0].node] or dsts
                out.append((f"t{a}", f"t{b}", srcs[0], far[-1]))
    return out


def run_scale(nodes: int, work: Path) -> None:
    from enforcer import service
    from tests.agent.harness import served_fabric

    lab_home = work / f"lab{nodes}"
    file = work / f"fabric{nodes}.yaml"
    file.write_text(fabric_yaml(nodes))
    try:
        operations.up(lab_home, file, "agent")
        st = state.load(lab_home)
        assert st is not None
        with served_fabric(work / f"server{nodes}", file, td=TD) as served:
            rss0 = rss_mb()
            names = sorted({d.split(":", 1)[1] for d in st["devices"]})
            for n in names:
                served.agent(n, lab=lab_home, loop=LOOP)
            env = served.env

            def in_sync() -> bool:
                r = env.call("GET", "/v1/devices", "admin")
                return r.status_code == 200 and all(d["in_sync"] for d in r.json())

            if not wait_until(in_sync, 120):
                raise RuntimeError(f"{nodes} nodes: the agents did not converge within 120 s")
            per_agent_mb = (rss_mb() - rss0) / len(names)
            pairs = grant_pairs(st)
            latencies, publishes, bare = [], [], []
            idle_cpu = _agent_cpu(names, 2 * LOOP.drift_every)  # two drift rounds
            churn_start, churn_cpu0 = time.monotonic(), agents_cpu()
            for i in range(GRANTS):
                src_t, dst_t, src, dst = pairs[i % len(pairs)]
                dev = f"nic:{src.node}"
                with env.ctx.db.read_session() as s:
                    before = service.get_state(s, dev).version
                r = env.call("POST", "/v1/grants", "tenant-admin", src_t, json={
                    "src_group": "train", "dst_tenant": dst_t, "dst_group": "data", "proto": "tcp",
                    "ports": [5432], "ttl_seconds": 3600})
                assert r.status_code == 201, r.text
                gid = r.json()["id"]
                published: list[float] = []

                def watch(dev: str = dev, before: int = before, out: list[float] = published) -> None:
                    end = time.monotonic() + 30
                    while time.monotonic() < end:
                        with env.ctx.db.read_session() as s:
                            if service.get_state(s, dev).version > before:
                                out.append(time.perf_counter())
                                return
                        time.sleep(0.002)

                with listening([(dst, 4, 5432)]):
                    watcher = threading.Thread(target=watch, daemon=True)
                    watcher.start()
                    start = time.perf_counter()
                    ok = env.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", dst_t, json={})
                    assert ok.status_code == 200 and ok.json()["state"] == "active", ok.text
                    opened = None
                    while time.perf_counter() - start < 30:
                        if connect(src, dst, 5432, timeout=CONNECT_TIMEOUT)[0]:
                            opened = time.perf_counter()
                            break
                    watcher.join(30)
                    if opened is None:
                        raise RuntimeError(f"grant {gid} never opened {src.workload} -> {dst.workload}")
                    latencies.append(opened - start)
                    publishes.append((published[0] if published else opened) - start)
                    bare.append(connect(src, dst, 5432, timeout=1.0)[1])
                    env.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", dst_t, json={"reason": "bench"})
                    wait_until(lambda s=src, d=dst: not connect(s, d, 5432, timeout=0.05)[0], 30)
            churn_seconds = time.monotonic() - churn_start
            churn_cpu = (agents_cpu() - churn_cpu0) / churn_seconds / len(names)
            agents = f"{nodes} node + {len(names) - nodes} leaf agents"
            print(f"# {nodes} nodes ({agents}), {GRANTS} grants, drift checks every {LOOP.drift_every:g} s; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
            line(f"grant_to_wire p50 ({nodes} node agents)", statistics.median(latencies) * 1000, "ms",
                 statistics.median(publishes) * 1000, "server-side publish ")
            line(f"grant_to_wire p99 ({nodes} node agents)", pct(latencies, 99) * 1000, "ms",
                 pct(publishes, 99) * 1000, "server-side publish ")
            line(f"grant_to_wire p50 vs bare connect ({nodes} node agents)", statistics.median(latencies) * 1000,
                 "ms", statistics.median(bare) * 1000, "bare TCP connect ")
            if nodes == max(SCALES):
                line(f"grant_to_wire p99 vs goal ({nodes} node agents)", pct(latencies, 99) * 1000, "ms", 1000.0,
                     "goal ")
                line("agent_cpu idle (per agent)", idle_cpu * 1000, "ms/s", 1000.0, "one core ")
                line("agent_cpu churn (per agent)", churn_cpu * 1000, "ms/s", 1000.0, "one core ")
                line("agent_rss (per agent, threads of one process)", per_agent_mb, "MB", rss0, "the process before ")
    finally:
        build.teardown(lab_home)


def _agent_cpu(names: list[str], seconds: float) -> float:
    before = agents_cpu()
    time.sleep(seconds)
    return (agents_cpu() - before) / seconds / len(names)


# ---------------------------------------------------------------------------------- 2. simulated agents

async def _sim_agent(url: str, device: str, ctx: ssl.SSLContext, stop: asyncio.Event, fetch: list[float],
                     health: list[float], errors: list[str]) -> None:
    """One simulated agent: per round a timed conditional fetch (304, or 200 and a status report), a timed
    GET /healthz on the same connection (the baseline), then a long-poll held until a publication or 10 s."""
    import httpx

    async with httpx.AsyncClient(base_url=url, verify=ctx, timeout=60) as c:
        etag: str | None = None

        async def take(r: httpx.Response) -> None:
            nonlocal etag
            if r.status_code == 200:
                body = r.json()
                etag = body["content_hash"]
                rep = await c.post(f"/v1/devices/{device}/status", json={
                    "applied_version": body["version"], "applied_hash": etag})
                if rep.status_code != 200:
                    errors.append(f"status {rep.status_code}: {rep.text[:100]}")
            elif r.status_code != 304:
                errors.append(f"ruleset {r.status_code}: {r.text[:100]}")

        while not stop.is_set():
            try:
                headers = {"If-None-Match": f'"{etag}"'} if etag else {}
                t0 = time.perf_counter()
                r = await c.get(f"/v1/devices/{device}/ruleset", headers=headers)
                fetch.append(time.perf_counter() - t0)
                await take(r)
                t0 = time.perf_counter()
                h = await c.get("/healthz")
                health.append(time.perf_counter() - t0)
                if h.status_code != 200:
                    errors.append(f"healthz {h.status_code}")
                r = await c.get(f"/v1/devices/{device}/ruleset", params={"wait": 10},
                                headers={"If-None-Match": f'"{etag}"'})
                await take(r)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure is an error of the run
                errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)


def run_simulated(work: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    from agent.identity import new_key_and_csr
    from audit import Actor
    from pki.service import attest_node, create_join_token
    from tests.agent.harness import served_fabric

    file = work / f"fabric{SIM_AGENTS}.yaml"
    file.write_text(fabric_yaml(SIM_AGENTS))
    with served_fabric(work / "sim-server", file, td=TD) as served:
        env = served.env
        creds = work / "sim-creds"
        creds.mkdir()
        contexts = []
        for i in range(SIM_AGENTS):
            node = f"gpu{i:03d}"
            key, csr = new_key_and_csr(node)
            with env.ctx.db.session() as s:
                token = create_join_token(s, node_name=node, actor=Actor.system("bench"), clock=env.clock)
            with env.ctx.db.session() as s:
                issued = attest_node(s, env.ctx.keystore, token=token, csr_pem=csr.encode(), clock=env.clock)
            pem = creds / f"{node}.pem"
            pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()) + issued.full_chain_pem)
            ctx = ssl.create_default_context(cafile=str(served.tls.ca_file))
            ctx.load_cert_chain(str(pem))
            contexts.append((f"nic:{node}", ctx))
        fetch: list[float] = []
        health: list[float] = []
        errors: list[str] = []

        async def main() -> tuple[float, float]:
            stop = asyncio.Event()
            tasks = [asyncio.create_task(_sim_agent(served.url, d, c, stop, fetch, health, errors))
                     for d, c in contexts]
            await asyncio.sleep(3)  # every client connected and fetched its first rule set
            cpu0, t0 = thread_cpu(lambda n: True, main=False), time.monotonic()
            end = time.monotonic() + SIM_SECONDS
            pairs = [(f"t{a}", f"t{b}") for a in range(5) for b in range(5) if a != b]
            loop = asyncio.get_running_loop()
            while time.monotonic() < end:  # churn: a grant approved and revoked every second
                a, b = random.choice(pairs)

                def churn(a: str = a, b: str = b) -> None:
                    r = env.call("POST", "/v1/grants", "tenant-admin", a, json={
                        "src_group": "train", "dst_tenant": b, "dst_group": "data", "proto": "tcp",
                        "ports": [5432], "ttl_seconds": 3600})
                    if r.status_code == 201:
                        gid = r.json()["id"]
                        env.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", b, json={})
                        env.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", b, json={"reason": "bench"})

                await loop.run_in_executor(None, churn)
                await asyncio.sleep(1.0)
            cpu = thread_cpu(lambda n: True, main=False) - cpu0
            seconds = time.monotonic() - t0
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return cpu, seconds

        cpu, seconds = asyncio.run(main())
    print(f"# {SIM_AGENTS} simulated agents (mTLS, long-poll wait=10 s, status after each new set), "
          f"{seconds:.0f} s with a grant approved and revoked every second; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    line(f"sim_agents ruleset fetch p99 ({SIM_AGENTS})", pct(fetch, 99) * 1000, "ms", pct(health, 99) * 1000,
         "GET /healthz p99 ")
    line(f"sim_agents errors ({SIM_AGENTS})", len(errors), "errors", 0.0, "goal ")
    if errors:
        print("# first errors: " + "; ".join(errors[:5]))
    line(f"sim_agents server CPU ({SIM_AGENTS})", cpu / seconds * 1000, "ms/s", 1000.0, "one core ")


def main() -> int:
    try:
        build.require_root()
    except LabError as exc:
        print(f"# propagation benchmark skipped: {exc}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="tf-bench-prop-"))
    try:
        for n in SCALES:
            run_scale(n, work)
        if SIM_AGENTS:
            run_simulated(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
