"""X.509-SVID issuance with group commit, beside raw certificate signing measured in the same run.

Figures, each on SQLite (WAL, a file in a temp dir) and on PostgreSQL (a cluster of its own, fsync on), file
key store, ECDSA P-256, every issuance the whole service path (CSR parsed and signature-checked, registration
read, certificate signed, SVID row and audit event durable before the call returns):
- 64 concurrent requesters (threads of one process, as one API worker's thread pool) through
  pki.service.issue_x509_svid_grouped: one shared transaction per batch;
- the single-stream figure: one requester through the same path, and through issue_x509_svid (one
  transaction per issuance, the path before group commit);
- the baseline: raw `CertificateBuilder.sign` per second on one thread, in the same run on the same cores.
The goal (issue 11) is 64-requester throughput >= 0.5 of the baseline. Medians of RUNS runs.
"""

from __future__ import annotations

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from audit import Actor
from bench.audit import DurablePostgres
from bench.pki import _csr
from bench.progress import Progress
from core.clock import system_clock
from inventory.models import Tenant, Workload, WorkloadGroup
from keys.file import FileKeyStore
from keys.store import KeyStore
from pki import service
from store.db import Database, sqlite_url
from store.groupcommit import GroupCommitter
from workflows.schema import migrate

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
N = int(os.environ.get("BENCH_ISSUANCES", "640"))
REQUESTERS = 64
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
        for n in range(REQUESTERS):  # one identity per requester, as renewals from many workloads
            s.add(Workload(tenant="acme", group="web", name=f"w{n}",
                           spiffe_id=f"spiffe://{TD}/tenant/acme/group/web/w{n}", created_at=now))


def _raw_sign_rate(n: int) -> float:
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


def _threads_rate(threads: int, n: int, one: Callable[[int, bytes], None], csrs: list[bytes]) -> float:
    """Issuances per second by `threads` requesters sharing n CSRs; requester i issues for workload w<i>."""
    per = n // threads
    gate = threading.Barrier(threads + 1)

    def requester(i: int) -> None:
        gate.wait()
        for k in range(per):
            one(i, csrs[(i * per + k) % len(csrs)])

    pool = [threading.Thread(target=requester, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    return per * threads / (time.perf_counter() - start)


def bench_backend(name: str, db: Database, ks: KeyStore, csrs: list[bytes]) -> list[str]:
    committer = GroupCommitter(db)

    def grouped(i: int, csr: bytes) -> None:
        service.issue_x509_svid_grouped(db, committer, ks, csr_pem=csr, tenant="acme", group="web", workload=f"w{i}",
                                        ttl=None, actor=ACTOR, scope_tenant=None, clock=system_clock)

    def alone(i: int, csr: bytes) -> None:
        with db.session() as s:
            service.issue_x509_svid(s, ks, csr_pem=csr, tenant="acme", group="web", workload=f"w{i}", ttl=None,
                                    actor=ACTOR, scope_tenant=None, clock=system_clock)

    _threads_rate(8, 64, grouped, csrs)  # warm-up: connections, caches
    many, single, single_tx, raw, batches = [], [], [], [], []
    for _ in range(RUNS):
        raw.append(_raw_sign_rate(N))
        before = (committer.batches, committer.items)
        many.append(_threads_rate(REQUESTERS, N, grouped, csrs))
        batches.append((committer.items - before[1]) / max(1, committer.batches - before[0]))
        single.append(_threads_rate(1, N // 4, grouped, csrs))
        single_tx.append(_threads_rate(1, N // 4, alone, csrs))
    committer.close()
    base = statistics.median(raw)
    lines = []
    for figure, values in ((f"{name} x509-svid issued, {REQUESTERS} requesters, group commit", many),
                           (f"{name} x509-svid issued, 1 requester, group commit", single),
                           (f"{name} x509-svid issued, 1 requester, one transaction each", single_tx)):
        value = statistics.median(values)
        lines.append(f"{figure}: {value:.0f} svid/s (baseline raw CertificateBuilder.sign P-256 {base:.0f} cert/s, "
                     f"ratio {value / base:.2f})")
    lines.append(f"{name} issuances per group-committed transaction, {REQUESTERS} requesters: "
                 f"{statistics.median(batches):.1f} (median of {RUNS} runs)")
    ratio = statistics.median(many) / base
    lines.append(f"{name} goal {REQUESTERS}-requester throughput >= 0.5 of raw signing: "
                 f"{'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.2f})")
    return lines


def main() -> None:
    progress = Progress("issuance")
    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-issuance-"))
    out: list[str] = [f"# scale: {RUNS} runs x {N} issuances, {REQUESTERS} workloads, file key store, ECDSA "
                      f"P-256, {os.cpu_count()} cores; medians"]
    try:
        ks = FileKeyStore.open(tmp / "keys", key_file=FileKeyStore.create_key_file(tmp / "master.key"))
        csrs = [_csr() for _ in range(256)]
        progress.step("SQLite")
        db = Database(sqlite_url(tmp))
        migrate(db.engine)
        _seed(db, ks)
        out += bench_backend("sqlite", db, ks, csrs)
        db.dispose()
        progress.step("PostgreSQL (fsync on)")
        try:
            pg = DurablePostgres()
        except (RuntimeError, subprocess.CalledProcessError, KeyError, LookupError) as exc:
            out.append(f"postgresql: skipped ({exc})")
        else:
            try:
                pdb = Database(pg.url)
                migrate(pdb.engine)
                ks2 = FileKeyStore.open(tmp / "keys2", key_file=FileKeyStore.create_key_file(tmp / "master2.key"))
                _seed(pdb, ks2)
                out += bench_backend("postgresql", pdb, ks2, csrs)
                pdb.dispose()
            finally:
                pg.stop()
    finally:
        progress.done()
        shutil.rmtree(tmp, ignore_errors=True)
    for line in out:
        print(line, flush=True)


if __name__ == "__main__":
    main()
