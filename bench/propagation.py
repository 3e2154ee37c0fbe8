"""End-to-end propagation through real node agents (root; without it the benchmark says so and exits 0).

Every part runs as it would be deployed, in its own processes: the server is `trustfabric serve --tls` (one
uvicorn worker, the reconciler, SQLite), the agents run the real agent code in AGENT_PROCS processes (a GPU
node runs one agent in its own process; on this 2-core machine the 50 are packed into a few processes), and
this process drives the API and the wire. It shares the 2 cores with the lab's Open vSwitch and with
whatever else runs here: the load average is printed with every scale.

1. Grant to wire: a generated lab fabric of N GPU nodes (N = 1, 10, 50; lab.generate: 16 nodes per leaf,
   two spines) built in agent mode, the same fabric imported into the server, one agent per node and per
   leaf. Per grant: a tenant requests it, the destination tenant approves it through the API, and the clock
   runs from the approve call to the first TCP connection that completes through the lab (connects retried
   every CONNECT_TIMEOUT); then it is revoked and the path seen closed before the next. p50 / p99 over
   GRANTS grants (goal at 50 agents: p99 <= 1 s), each beside baselines of the same run: the server-side
   publish time (approve call to the source NIC's new desired version in the database) and a bare TCP
   connect over an open path.
2. 1,000 simulated agents: protocol-level clients (no namespaces; one mTLS client with its own node SVID
   each, asyncio in this process) long-poll their device's rule set and report status against the server
   (a fabric of 1,000 nodes; the fleet comes up over BENCH_SIM_RAMP s), while a grant is approved and
   revoked every BENCH_SIM_CHURN s: p99 of a conditional
   rule-set fetch (304, or 200 with the IR) vs a plain GET /healthz on the same connections, errors (goal
   0), and the server process's CPU per second of the run.
3. Agent CPU and memory at idle and during the grant churn of (1) at the largest scale: the agent
   processes' CPU (their threads and their ovs-ofctl / ip / nft children) per agent, and their RSS per agent
   beside one process's (a deployed agent is one process: the 1-node run shows its size alone).

Run: sudo .venv/bin/python bench/propagation.py   (BENCH_GRANTS, default 20; BENCH_SCALES, default 1,10,50;
BENCH_SIM_AGENTS, default 1000; BENCH_AGENT_PROCS, default 4)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import build, operations, state  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.generate import fabric_yaml  # noqa: E402
from lab.probe import Endpoint, connect, endpoint, listening  # noqa: E402

GRANTS = int(os.environ.get("BENCH_GRANTS", "20"))
SCALES = [int(x) for x in os.environ.get("BENCH_SCALES", "1,10,50").split(",") if x.strip()]
SIM_AGENTS = int(os.environ.get("BENCH_SIM_AGENTS", "1000"))
SIM_SECONDS = float(os.environ.get("BENCH_SIM_SECONDS", "30"))
RAMP = float(os.environ.get("BENCH_SIM_RAMP", "20"))  # seconds over which the simulated fleet comes up
CHURN = float(os.environ.get("BENCH_SIM_CHURN", "5"))  # seconds between grant changes (each touches ~40% of NICs)
AGENT_PROCS = int(os.environ.get("BENCH_AGENT_PROCS", "4"))
CONNECT_TIMEOUT = 0.02
TD = "bench.example"
BIN = str(Path(sys.executable).parent / "trustfabric")
# a deployed agent checks drift every 2 s on its own node; here 54 share two cores with the lab and the
# server, so the benchmark's agents check every 10 s (stated in the output)
DRIFT_EVERY = 10.0


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))] if s else float("nan")


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


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process and of its children it waited for (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the server

@dataclass
class Server:
    home: Path
    env: dict[str, str]
    url: str
    ca_file: Path
    admin: str
    proc: subprocess.Popen[bytes]

    def client(self, token: str | None = None) -> Any:
        import httpx

        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.ca_file)),
                            headers={"Authorization": f"Bearer {token or self.admin}"}, timeout=60)

    def settings(self) -> Any:
        from workflows.settings import Settings

        return Settings.from_env(self.env)


@contextmanager
def server_for(work: Path, fabric_file: Path, prepare: Callable[[Any], None] | None = None) -> Iterator[Server]:
    """`trustfabric serve --tls` on a free port over a data directory prepared here (trust domain, the
    fabric imported, the shipped policy active, then `prepare(ctx)`); stopped (SIGTERM, then SIGKILL)."""
    from audit import Actor
    from pki.service import bundle_pem
    from workflows.context import AppContext
    from workflows.fabric import Who, import_fabric
    from workflows.init import initialize
    from workflows.settings import Settings

    home = work / "home"
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")},
           "TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_TRUST_DOMAIN": TD, "TRUSTFABRIC_MODE": "development",
           "TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "0", "TRUSTFABRIC_ENFORCER_POLL_SECONDS": "0.2",
           # every simulated agent and every agent process dials from 127.0.0.1: one address, not a flood
           "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND": "0",
           # each agent holds a long-poll open: a fleet of SIM_AGENTS needs more than the default bound of
           # 1,000 connections per worker (uvicorn answers the ones beyond it 503), as a deployment sizes it
           "TRUSTFABRIC_MAX_CONNECTIONS": str(max(1000, 2 * SIM_AGENTS))}
    ctx = AppContext.open(Settings.from_env(env), create=True)
    try:
        admin = initialize(ctx, TD, "ec-p256")["admin_token"]
        with ctx.db.session() as s:
            import_fabric(s, Who(Actor.system("bench"), ctx.clock), ctx.settings.pools(), fabric_file.read_text())
        with ctx.db.read_session() as s:
            ca = work / "ca.pem"
            ca.write_bytes(bundle_pem(s, ctx.clock))
        if prepare is not None:
            prepare(ctx)
    finally:
        ctx.close()
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen([BIN, "serve", "--tls", "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    server = Server(home, env, f"https://127.0.0.1:{port}", ca, admin, proc)
    try:
        with server.client() as c:

            def up() -> bool:
                try:
                    return bool(c.get("/healthz").status_code == 200)
                except Exception:
                    return False

            if not wait_until(up, 60):
                raise RuntimeError(f"the server did not start: {(work / 'serve.log').read_text()[-2000:]}")
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def join_tokens(server: Server, nodes: list[str]) -> dict[str, str]:
    from audit import Actor
    from pki.service import create_join_token
    from workflows.context import AppContext

    ctx = AppContext.open(server.settings())
    try:
        out = {}
        for n in nodes:
            with ctx.db.session() as s:
                out[n] = create_join_token(s, node_name=n, actor=Actor.system("bench"), clock=ctx.clock)
        return out
    finally:
        ctx.close()


# ---------------------------------------------------------------------------------------------- agent processes

def agent_host() -> None:
    """`propagation.py --agents`: run the agents described on stdin until SIGTERM (one agent process group)."""
    from agent.device_loop import LoopSettings
    from agent.runner import Agent, AgentConfig

    spec = json.loads(sys.stdin.read())
    loop = LoopSettings(wait=30, drift_every=spec["drift_every"], report_every=10.0)
    agents = [Agent(AgentConfig(node=a["node"], server=spec["server"], ca_file=Path(spec["ca"]),
                                data_dir=Path(a["data"]), join_token=a["token"], lab_home=Path(spec["lab"]),
                                loop=loop)) for a in spec["agents"]]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for a in agents:
        a.start()
    print("started", flush=True)
    stop.wait()
    for a in agents:
        a.stop()


@contextmanager
def agent_processes(server: Server, lab_home: Path, nodes: list[str], work: Path) -> Iterator[list[int]]:
    tokens = join_tokens(server, nodes)
    groups = [nodes[i::AGENT_PROCS] for i in range(min(AGENT_PROCS, len(nodes)))]
    procs = []
    try:
        for i, group in enumerate(groups):
            spec = {"server": server.url, "ca": str(server.ca_file), "lab": str(lab_home), "drift_every": DRIFT_EVERY,
                    "agents": [{"node": n, "token": tokens[n], "data": str(work / "agents" / n)} for n in group]}
            log = (work / f"agents{i}.log").open("wb")
            p = subprocess.Popen([sys.executable, __file__, "--agents"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=log)
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(json.dumps(spec).encode())
            p.stdin.close()
            procs.append(p)
        for i, p in enumerate(procs):
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"started":
                raise RuntimeError(f"agent process {i} failed: {(work / f'agents{i}.log').read_text()[-2000:]}")
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


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
    from workflows.context import AppContext

    work.mkdir(parents=True)
    lab_home = work / "lab"
    file = work / "fabric.yaml"
    file.write_text(fabric_yaml(nodes))
    try:
        operations.up(lab_home, file, "agent")
        st = state.load(lab_home)
        assert st is not None
        names = sorted({d.split(":", 1)[1] for d in st["devices"]})
        with server_for(work, file) as server, server.client() as admin, \
                agent_processes(server, lab_home, names, work) as pids:
            def in_sync() -> bool:
                r = admin.get("/v1/devices")
                return r.status_code == 200 and all(d["in_sync"] for d in r.json())

            if not wait_until(in_sync, 180):
                raise RuntimeError(f"{nodes} nodes: the agents did not converge within 180 s")
            tenants = {}
            for t in range(5):
                r = admin.post("/v1/tokens", json={"role": "tenant-admin", "tenant": f"t{t}", "ttl_seconds": 7200})
                assert r.status_code == 201, r.text
                tenants[f"t{t}"] = server.client(r.json()["token"])
            db = AppContext.open(server.settings())
            pairs = grant_pairs(st)
            latencies, publishes, bare = [], [], []
            idle_cpu = _agents_cpu(pids, 2 * DRIFT_EVERY) / len(names)  # two drift rounds
            rss = sum(proc_rss_mb(p) for p in pids)
            churn_start, churn_cpu0 = time.monotonic(), sum(proc_cpu(p) for p in pids)
            for i in range(GRANTS):
                src_t, dst_t, src, dst = pairs[i % len(pairs)]
                dev = f"nic:{src.node}"
                with db.db.read_session() as s:
                    before = service.get_state(s, dev).version
                r = tenants[src_t].post("/v1/grants", json={
                    "src_group": "train", "dst_tenant": dst_t, "dst_group": "data", "proto": "tcp",
                    "ports": [5432], "ttl_seconds": 3600})
                assert r.status_code == 201, r.text
                gid = r.json()["id"]
                published: list[float] = []

                def watch(dev: str = dev, before: int = before, out: list[float] = published) -> None:
                    end = time.monotonic() + 30
                    while time.monotonic() < end:
                        with db.db.read_session() as s:
                            if service.get_state(s, dev).version > before:
                                out.append(time.perf_counter())
                                return
                        time.sleep(0.002)

                with listening([(dst, 4, 5432)]):
                    watcher = threading.Thread(target=watch, daemon=True)
                    watcher.start()
                    start = time.perf_counter()
                    ok = tenants[dst_t].post(f"/v1/grants/{gid}/approve", json={})
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
                    tenants[dst_t].post(f"/v1/grants/{gid}/revoke", json={"reason": "bench"})
                    wait_until(lambda s=src, d=dst: not connect(s, d, 5432, timeout=0.05)[0], 30)
            churn_cpu = (sum(proc_cpu(p) for p in pids) - churn_cpu0) / (time.monotonic() - churn_start) / len(names)
            db.close()
            for c in tenants.values():
                c.close()
            agents = f"{nodes} node + {len(names) - nodes} leaf agents in {len(pids)} processes"
            print(f"# {nodes} nodes ({agents}), {GRANTS} grants, drift checks every {DRIFT_EVERY:g} s; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
            line(f"grant_to_wire p50 ({nodes} node agents)", statistics.median(latencies) * 1000, "ms",
                 statistics.median(publishes) * 1000, "server-side publish ")
            line(f"grant_to_wire p99 ({nodes} node agents)", pct(latencies, 99) * 1000, "ms",
                 pct(publishes, 99) * 1000, "server-side publish ")
            line(f"grant_to_wire p50 vs bare connect ({nodes} node agents)", statistics.median(latencies) * 1000,
                 "ms", statistics.median(bare) * 1000, "bare TCP connect ")
            if nodes == max(SCALES, default=0):
                line(f"grant_to_wire p99 vs goal ({nodes} node agents)", pct(latencies, 99) * 1000, "ms", 1000.0,
                     "goal ")
                line("agent_cpu idle (per agent)", idle_cpu * 1000, "ms/s", 1000.0, "one core ")
                line("agent_cpu churn (per agent)", churn_cpu * 1000, "ms/s", 1000.0, "one core ")
                line("agent_rss (per agent, packed)", rss / len(names), "MB", rss / len(pids),
                     f"one process of {len(names) // len(pids)} agents ")
    finally:
        build.teardown(lab_home)


def _agents_cpu(pids: list[int], seconds: float) -> float:
    before = sum(proc_cpu(p) for p in pids)
    time.sleep(seconds)
    return (sum(proc_cpu(p) for p in pids) - before) / seconds


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
            except Exception as exc:  # every failure is an error of the run; back off like the agent
                errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)


def run_simulated(work: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    from agent.identity import new_key_and_csr
    from audit import Actor
    from pki.service import attest_node, create_join_token

    work.mkdir(parents=True)
    file = work / "fabric.yaml"
    file.write_text(fabric_yaml(SIM_AGENTS))
    creds = work / "sim-creds"
    creds.mkdir()
    devices: list[tuple[str, Path]] = []

    def node_svids(ctx: Any) -> None:  # one node SVID per simulated agent, as its join token would give it
        for i in range(SIM_AGENTS):
            node = f"gpu{i:03d}"
            key, csr = new_key_and_csr(node)
            with ctx.db.session() as s:
                token = create_join_token(s, node_name=node, actor=Actor.system("bench"), clock=ctx.clock)
                issued = attest_node(s, ctx.keystore, token=token, csr_pem=csr.encode(), clock=ctx.clock)
            pem = creds / f"{node}.pem"
            pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()) + issued.full_chain_pem)
            devices.append((f"nic:{node}", pem))

    fetch: list[float] = []
    health: list[float] = []
    errors: list[str] = []
    with server_for(work, file, node_svids) as server, server.client() as admin:
        tenants = {}
        for t in range(5):
            r = admin.post("/v1/tokens", json={"role": "tenant-admin", "tenant": f"t{t}", "ttl_seconds": 7200})
            assert r.status_code == 201, r.text
            tenants[f"t{t}"] = server.client(r.json()["token"])

        def churn(a: str, b: str) -> None:
            try:
                grant(a, b)
            except Exception as exc:  # a slow or failed answer is an error of the run, not its end
                errors.append(f"grant churn: {type(exc).__name__}: {exc}")

        def grant(a: str, b: str) -> None:
            r = tenants[a].post("/v1/grants", json={"src_group": "train", "dst_tenant": b, "dst_group": "data",
                                                    "proto": "tcp", "ports": [5432], "ttl_seconds": 3600})
            if r.status_code != 201:
                errors.append(f"grant request {r.status_code}")
                return
            gid = r.json()["id"]
            tenants[b].post(f"/v1/grants/{gid}/approve", json={})
            tenants[b].post(f"/v1/grants/{gid}/revoke", json={"reason": "bench"})

        async def main() -> tuple[float, float]:
            stop = asyncio.Event()
            contexts = []
            for device, pem in devices:
                ctx = ssl.create_default_context(cafile=str(server.ca_file))
                ctx.load_cert_chain(str(pem))
                contexts.append((device, ctx))
            tasks = []
            for d, c in contexts:  # a fleet comes up over RAMP seconds, not in one instant
                tasks.append(asyncio.create_task(_sim_agent(server.url, d, c, stop, fetch, health, errors)))
                await asyncio.sleep(RAMP / len(contexts))
            deadline = time.monotonic() + 300
            while len(fetch) < SIM_AGENTS and time.monotonic() < deadline:  # every client connected once
                await asyncio.sleep(0.5)
            fetch.clear()
            health.clear()
            cpu0, t0 = proc_cpu(server.proc.pid), time.monotonic()
            pairs = [(f"t{a}", f"t{b}") for a in range(5) for b in range(5) if a != b]
            loop = asyncio.get_running_loop()
            while time.monotonic() - t0 < SIM_SECONDS:  # churn: a grant approved and revoked every CHURN s
                await loop.run_in_executor(None, churn, *random.choice(pairs))
                await asyncio.sleep(CHURN)
            cpu, seconds = proc_cpu(server.proc.pid) - cpu0, time.monotonic() - t0
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return cpu, seconds

        cpu, seconds = asyncio.run(main())
        for c in tenants.values():
            c.close()
    print(f"# {SIM_AGENTS} simulated agents (mTLS, long-poll wait=10 s, status after each new set; up over "
          f"{RAMP:g} s), {seconds:.0f} s with a grant approved and revoked every {CHURN:g} s (each reaches ~40% of "
          f"the NICs: a tenant's groups span a fifth of the nodes); {len(fetch)} fetches; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    line(f"sim_agents ruleset fetch p99 ({SIM_AGENTS})", pct(fetch, 99) * 1000, "ms", pct(health, 99) * 1000,
         "GET /healthz p99 ")
    line(f"sim_agents errors ({SIM_AGENTS})", len(errors), "errors", 0.0, "goal ")
    if errors:
        print("# first errors: " + "; ".join(errors[:5]))
    line(f"sim_agents server CPU ({SIM_AGENTS})", cpu / seconds * 1000, "ms/s", 1000.0, "one core ")


def main() -> int:
    if sys.argv[1:] == ["--agents"]:
        agent_host()
        return 0
    try:
        build.require_root()
    except LabError as exc:
        print(f"# propagation benchmark skipped: {exc}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="tf-bench-prop-"))
    try:
        for n in SCALES:
            run_scale(n, work / f"scale{n}")
        if SIM_AGENTS:
            run_simulated(work / "sim")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
