"""X.509-SVID issuance with group commit, beside raw certificate signing measured in the same run.

Every issuance takes the whole service path on SQLite (WAL, a file in a temp dir) and on PostgreSQL (a cluster of
its own, fsync on), file key store, ECDSA P-256: CSR parsed and its signature checked, registration checked,
certificate signed, SVID row and audit event durable before the call returns.

Figures, per database:
- the goal's (issue 11): issuance by PROCS processes (the cores; `serve --workers N`) of 32 requester threads
  each, one group committer per process, against one database, beside raw `CertificateBuilder.sign` by PROCS
  processes in the same run on the same cores: the whole machine against the whole machine;
- 64 requesters in one process (one API worker's thread pool) beside raw signing on one thread (per core);
- the single-stream figures: one requester through the group committer, and through issue_x509_svid (one
  transaction per issuance, the path before group commit);
- through HTTP on one replica (SQLite): renewals/s and the server's CPU per SVID, one request per SVID against
  POST /v1/svids/x509/batch with 1, 16 and 64 entries (BENCH_ISSUANCE_PARTS=http runs only these);
- CPU time per SVID of the 64-requester run (this process; and on PostgreSQL the server's processes), beside
  the CPU time of one raw signature: CPU time does not depend on the other load of the machine, wall rates do.

The ceiling: cryptography holds the GIL while it signs and verifies, and every issuance must verify its CSR
(the service's own check, pki.x509svid.parse_csr: the PEM parsed, the key loaded, an ECDSA verification with it;
~56 us quiet against ~38 us for the raw signature when it was load + is_signature_valid, which loads the key a
second time: ~10% less since). So even with nothing else to do, issuance per core is at most
sign / (sign + CSR check) of raw signing: about 0.40, below the goal of 0.5, whatever the database. The run
measures both and prints the ceiling.
Medians of RUNS runs; the load average beside the figures.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from audit import Actor
from audit.service import lock_head
from bench.audit import DurablePostgres
from bench.pki import _csr
from bench.progress import Progress
from core.clock import system_clock
from inventory.models import Tenant, Workload, WorkloadGroup
from keys.file import FileKeyStore
from keys.store import KeyStore
from pki import service
from pki.x509svid import parse_csr
from store.db import Database, sqlite_url
from store.groupcommit import GroupCommitter
from workflows.schema import migrate

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
N = int(os.environ.get("BENCH_ISSUANCES", "1920"))  # per run (30 per requester); the single streams take N // 8
REQUESTERS = 64
PROCS = int(os.environ.get("BENCH_PROCS", str(os.cpu_count() or 1)))
PER_PROC = 32  # requester threads per process in the deployment-shaped figure
RAW_N = int(os.environ.get("BENCH_RAW_SIGNATURES", "10000"))  # per run and process: long enough to time well
WORKLOADS = max(REQUESTERS, PROCS * PER_PROC)
TD = "bench.example"
ACTOR = Actor(id="bench", kind="admin")


def _seed(db: Database, ks: KeyStore) -> None:
    now = datetime.now(UTC)
    with db.session() as s:
        service.init_trust_domain(s, ks, trust_domain=TD)
        s.add(Tenant(slug="acme", display_name="acme", created_at=now))
        s.flush()
        s.add(WorkloadGroup(tenant="acme", name="web", created_at=now))
        s.flush()
        for n in range(WORKLOADS):  # one identity per requester, as renewals from many workloads
            s.add(Workload(tenant="acme", group="web", name=f"w{n}",
                           spiffe_id=f"spiffe://{TD}/tenant/acme/group/web/w{n}", created_at=now))


def _raw_sign_rate(n: int) -> float:
    """Raw signatures per second on this thread."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf_pub = ec.generate_private_key(ec.SECP256R1()).public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    now = datetime.now(UTC)
    start = time.perf_counter()
    for _ in range(n):
        (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(leaf_pub)
         .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + timedelta(hours=1))
         .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TD}/w")]),
                        critical=False)
         .sign(ca_key, hashes.SHA256()))
    return n / (time.perf_counter() - start)


def _csr_check_seconds(csrs: list[bytes], n: int) -> float:
    """Thread CPU seconds of the CSR check every issuance makes: the service's own (pki.x509svid.parse_csr: parse,
    algorithm, key, signature verification)."""
    start = time.thread_time()
    for k in range(n):
        parse_csr(csrs[k % len(csrs)])
    return (time.thread_time() - start) / n


def _sign_seconds(n: int) -> float:
    start = time.thread_time()
    _raw_sign_rate(n)
    return (time.thread_time() - start) / n


def _threads_rate(threads: int, n: int, one: Callable[[int, bytes], None], csrs: list[bytes],
                  first: int = 0) -> float:
    """Issuances per second by `threads` requesters sharing n CSRs; requester i issues for workload w<first+i>."""
    per = n // threads
    gate = threading.Barrier(threads + 1)

    def requester(i: int) -> None:
        gate.wait()
        for k in range(per):
            one(first + i, csrs[(i * per + k) % len(csrs)])

    pool = [threading.Thread(target=requester, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    return per * threads / (time.perf_counter() - start)


def _grouped(db: Database, committer: GroupCommitter, ks: KeyStore) -> Callable[[int, bytes], None]:
    def one(i: int, csr: bytes) -> None:
        service.issue_x509_svid_grouped(db, committer, ks, csr_pem=csr, tenant="acme", group="web", workload=f"w{i}",
                                        ttl=None, actor=ACTOR, scope_tenant=None, clock=system_clock)
    return one


# --- several processes --------------------------------------------------------------------------------------

def _raw_worker(gate: Any, results: Any, n: int) -> None:
    _raw_sign_rate(16)  # warm
    gate.wait(timeout=120)
    _raw_sign_rate(n)
    results.put(time.monotonic())


def _issue_worker(gate: Any, results: Any, url: str, keys: str, master: str, proc: int, n: int,
                  csrs: list[bytes]) -> None:
    db = Database(url)
    ks = FileKeyStore.open(Path(keys), key_file=Path(master))
    committer = GroupCommitter(db, head_lock=lock_head)
    one = _grouped(db, committer, ks)
    try:
        _threads_rate(PER_PROC, PER_PROC * 2, one, csrs, first=proc * PER_PROC)  # warm: connections, caches
        gate.wait(timeout=120)
        _threads_rate(PER_PROC, n, one, csrs, first=proc * PER_PROC)
        results.put(time.monotonic())
    finally:
        committer.close()
        db.dispose()


def _processes_rate(target: Callable[..., None], args: Callable[[int], tuple[Any, ...]], total: int) -> float:
    """`total` operations split over PROCS processes started together; operations per second of the whole."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding threads and connections
    gate, results = ctx.Barrier(PROCS + 1), ctx.Queue()
    procs = [ctx.Process(target=target, args=(gate, results, *args(p))) for p in range(PROCS)]
    for p in procs:
        p.start()
    try:
        gate.wait(timeout=120)
        start = time.monotonic()
        ends = [results.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return total / (max(ends) - start)


# --- one database -------------------------------------------------------------------------------------------

def _server_cpu(pg: DurablePostgres | None) -> float:
    """CPU seconds (user + system) of the PostgreSQL server's processes so far, the exited ones included (the
    postmaster reaps its backends: their time is in its children's); 0 without one."""
    if pg is None:
        return 0.0
    master = int((pg.data / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == master:  # utime, stime, and cutime, cstime: its reaped children's
            total += sum(int(f) for f in fields[11:15]) / tick
        elif int(fields[1]) == master:  # a live backend: utime, stime
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def bench_backend(name: str, db: Database, ks: KeyStore, keys: tuple[Path, Path], csrs: list[bytes],
                  pg: DurablePostgres | None) -> list[str]:
    committer = GroupCommitter(db, head_lock=lock_head)
    grouped = _grouped(db, committer, ks)

    def alone(i: int, csr: bytes) -> None:
        with db.session() as s:
            service.issue_x509_svid(s, ks, csr_pem=csr, tenant="acme", group="web", workload=f"w{i}", ttl=None,
                                    actor=ACTOR, scope_tenant=None, clock=system_clock)

    _threads_rate(8, 64, grouped, csrs)  # warm-up: connections, caches
    many, single, single_tx, raw, raw_cpu, batches, cpu, server = [], [], [], [], [], [], [], []
    raw_procs, many_procs = [], []
    per = N // REQUESTERS * REQUESTERS
    for _ in range(RUNS):
        cpu0 = time.thread_time()
        raw.append(_raw_sign_rate(RAW_N))
        raw_cpu.append((time.thread_time() - cpu0) / RAW_N)
        before = (committer.batches, committer.items)
        cpu0, server0 = time.process_time(), _server_cpu(pg)
        many.append(_threads_rate(REQUESTERS, N, grouped, csrs))
        cpu.append((time.process_time() - cpu0) / per)
        server.append((_server_cpu(pg) - server0) / per)
        batches.append((committer.items - before[1]) / max(1, committer.batches - before[0]))
        single.append(_threads_rate(1, N // 8, grouped, csrs))
        single_tx.append(_threads_rate(1, N // 8, alone, csrs))
        raw_procs.append(_processes_rate(_raw_worker, lambda p: (RAW_N,), RAW_N * PROCS))
        many_procs.append(_processes_rate(
            _issue_worker, lambda p: (db.url, str(keys[0]), str(keys[1]), p, N, csrs), N * PROCS))
    committer.close()
    base, base_procs = statistics.median(raw), statistics.median(raw_procs)
    sign_us = 1e6 * statistics.median(raw_cpu)
    lines = []
    goal = statistics.median(many_procs) / base_procs
    lines.append(f"{name} x509-svid issued, {PROCS} processes x {PER_PROC} requesters, group commit (the goal's "
                 f"figure): {statistics.median(many_procs):.0f} svid/s (baseline raw CertificateBuilder.sign P-256 "
                 f"on {PROCS} processes {base_procs:.0f} cert/s, ratio {goal:.2f})")
    for figure, values in ((f"{name} x509-svid issued, {REQUESTERS} requesters in one process, group commit", many),
                           (f"{name} x509-svid issued, 1 requester, group commit", single),
                           (f"{name} x509-svid issued, 1 requester, one transaction each", single_tx)):
        value = statistics.median(values)
        lines.append(f"{figure}: {value:.0f} svid/s (baseline raw CertificateBuilder.sign P-256 on one thread "
                     f"{base:.0f} cert/s, ratio {value / base:.2f})")
    cpu_us = 1e6 * statistics.median(cpu)
    lines.append(f"{name} CPU per x509-svid, {REQUESTERS} requesters, this process: {cpu_us:.0f} us (baseline raw "
                 f"CertificateBuilder.sign {sign_us:.0f} us, ratio {sign_us / cpu_us:.2f})")
    if pg is not None:
        server_us = 1e6 * statistics.median(server)
        lines.append(f"{name} CPU per x509-svid, {REQUESTERS} requesters, this process + the PostgreSQL server: "
                     f"{cpu_us + server_us:.0f} us (baseline raw CertificateBuilder.sign {sign_us:.0f} us, ratio "
                     f"{sign_us / (cpu_us + server_us):.2f}; the server's part {server_us:.0f} us)")
    lines.append(f"{name} issuances per group-committed transaction, {REQUESTERS} requesters: "
                 f"{statistics.median(batches):.1f} (median of {RUNS} runs)")
    lines.append(f"{name} goal {PROCS}-process issuance >= 0.5 of {PROCS}-process raw signing: "
                 f"{'met' if goal >= 0.5 else 'NOT met'} ({goal:.2f})")
    return lines


HTTP_BATCHES = (1, 16, 64)  # entries per POST /v1/svids/x509/batch in the HTTP figures


def http_figures(work: Path) -> list[str]:
    """Renewals through HTTP on one replica (`trustfabric serve`, SQLite in its data directory): one request per
    SVID (POST /v1/svids/x509) against batches of HTTP_BATCHES entries (POST /v1/svids/x509/batch, distinct
    workloads, a tenant's token), each a closed loop of bench/api.py's load generator (CONNECTIONS keep-alive
    connections from LOAD_PROCESSES processes, DURATION s, median of RUNS runs); renewals/s and the server
    process's CPU per SVID (user + system time of the replica and its children, sampled around each run)."""
    from bench.api import CONNECTIONS, DURATION, LOAD_PROCESSES, bench_env, call, measure, median_runs, mint
    from bench.replicas import cpu_seconds
    from tests.conftest import _free_port
    from tests.servers import serve_replicas

    binary = str(Path(sys.executable).parent / "trustfabric")
    work.mkdir(parents=True, exist_ok=True)
    env = bench_env(work, TRUSTFABRIC_LOG_LEVEL="warning")
    port = _free_port()
    most = max(HTTP_BATCHES)
    csr = _csr().decode()  # one key for every entry, as an agent reusing a key: the CSR check costs the same
    with serve_replicas(binary, 1, env=env, cwd=work, ports=[port]) as replicas:
        pid = replicas[0].proc.pid
        admin = mint(env, work, "--role", "admin")
        assert call(port, "POST", "/v1/tenants", admin, {"slug": "acme", "display_name": "acme"})[0] == 201
        assert call(port, "POST", "/v1/tenants/acme/groups", admin, {"name": "web"})[0] == 201
        for n in range(most):
            assert call(port, "POST", "/v1/tenants/acme/groups/web/workloads", admin, {"name": f"w{n}"})[0] == 201
        token = mint(env, work, "--role", "tenant-admin", "--tenant", "acme")

        def entry(n: int) -> dict[str, Any]:
            return {"csr": csr, "tenant": "acme", "group": "web", "workload": f"w{n}", "ttl_seconds": 3600}

        def renewals(path: str, body: dict[str, Any], per_request: int) -> dict[str, float]:
            def one() -> dict[str, float]:
                before = cpu_seconds([pid])
                got = measure(port, "POST", path, token, body)
                svids = max(1.0, got["rps"] * DURATION * per_request)
                return {"svids_per_s": got["rps"] * per_request, "p99": got["p99"],
                        "cpu_ms": (cpu_seconds([pid]) - before) * 1000 / svids}
            return median_runs(one)

        single = renewals("/v1/svids/x509", entry(0), 1)  # (warm first: each path's caches fill on its first use)
        single = renewals("/v1/svids/x509", entry(0), 1)
        batches = {k: renewals("/v1/svids/x509/batch", {"svids": [entry(n) for n in range(k)]}, k)
                   for k in HTTP_BATCHES}
    out = [f"# HTTP scale: 1 replica (`trustfabric serve`), SQLite, a tenant token, {CONNECTIONS} keep-alive "
           f"connections from {LOAD_PROCESSES} load processes, closed loop, median of {RUNS} runs x {DURATION:g} s; "
           f"{os.cpu_count()} cores shared by server and load (and, here, other work: figures are noisy)",
           f"svid_renewals_http_single: {single['svids_per_s']:.1f} SVIDs/s, server CPU {single['cpu_ms']:.2f} ms "
           f"per SVID, p99 {single['p99']:.1f} ms per request"]
    for k, got in batches.items():
        out.append(f"svid_renewals_http_batch{k}: {got['svids_per_s']:.1f} SVIDs/s (baseline single requests "
                   f"{single['svids_per_s']:.1f} SVIDs/s, ratio {got['svids_per_s'] / single['svids_per_s']:.2f}); "
                   f"p99 {got['p99']:.1f} ms per request")
        out.append(f"svid_server_cpu_per_svid_batch{k}: {got['cpu_ms']:.2f} ms (baseline single requests "
                   f"{single['cpu_ms']:.2f} ms, ratio {got['cpu_ms'] / single['cpu_ms']:.2f})")
    return out


def main() -> None:
    if os.environ.get("BENCH_ISSUANCE_PARTS", "service,http") == "http":  # the HTTP figures alone
        work = Path(tempfile.mkdtemp(prefix="tf-bench-issuance-http-"))
        try:
            lines = http_figures(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for line in lines:
            print(line, flush=True)
        return
    progress = Progress("issuance")
    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-issuance-"))
    load = os.getloadavg()
    out: list[str] = [f"# scale: {RUNS} runs x {N} issuances ({N} per process in the goal's figure) and {RAW_N} "
                      f"raw signatures (per process), {WORKLOADS} workloads, file key store, ECDSA "
                      f"P-256, {os.cpu_count()} cores, {PROCS} processes in the goal's figure; medians; "
                      f"load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"]
    try:
        csrs = [_csr() for _ in range(256)]
        sign, check = _sign_seconds(2000), _csr_check_seconds(csrs, 2000)
        out.append(f"x509-svid ceiling per core, raw sign / (raw sign + CSR check): {sign / (sign + check):.2f} "
                   f"(raw CertificateBuilder.sign {1e6 * sign:.0f} us, CSR parse + signature check {1e6 * check:.0f} "
                   f"us, CPU time on one thread; the goal 0.5 is above it)")
        for name in ("sqlite", "postgresql"):
            progress.step("SQLite" if name == "sqlite" else "PostgreSQL (fsync on)")
            pg = None
            if name == "postgresql":
                try:
                    pg = DurablePostgres()
                except (RuntimeError, subprocess.CalledProcessError, KeyError, LookupError) as exc:
                    out.append(f"postgresql: skipped ({exc})")
                    continue
            try:
                keys = (tmp / f"keys-{name}", tmp / f"master-{name}.key")
                ks = FileKeyStore.open(keys[0], key_file=FileKeyStore.create_key_file(keys[1]))
                db = Database(pg.url if pg is not None else sqlite_url(tmp))
                migrate(db.engine)
                _seed(db, ks)
                out += bench_backend(name, db, ks, keys, csrs, pg)
                db.dispose()
            finally:
                if pg is not None:
                    pg.stop()
        if "http" in os.environ.get("BENCH_ISSUANCE_PARTS", "service,http").split(","):
            progress.step("HTTP: single requests against batches, one replica on SQLite")
            out += http_figures(tmp / "http")
        load = os.getloadavg()
        out.append(f"# load average at end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    finally:
        progress.done()
        shutil.rmtree(tmp, ignore_errors=True)
    for line in out:
        print(line, flush=True)


if __name__ == "__main__":
    main()
