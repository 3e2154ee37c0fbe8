"""PKI throughput beside raw crypto measured in the same run.

Figures (medians of RUNS runs, N operations each, one transaction per operation, SQLite file in a temp
dir, file key store):
- X.509-SVIDs issued/s through pki.service (CSR parsed and signature-checked, registration looked up,
  certificate signed, SVID row and audit event committed) vs raw `CertificateBuilder.sign` (P-256);
- the same issuance rate vs raw ECDSA P-256 signatures/s;
- JWT-SVIDs minted/s through pki.service vs raw `jwt.encode` (ES256).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from audit import Actor
from core.clock import system_clock
from inventory.models import Tenant, Workload, WorkloadGroup
from keys.file import FileKeyStore
from pki import service
from store.db import Database, sqlite_url
from workflows.schema import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.progress import Progress

RUNS = 5
N = 200
TD = "bench.example"
ACTOR = Actor(id="bench", kind="admin")


def _rate(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def _median(fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(RUNS))


def _csr() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "w")]))
            .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def line(figure: str, value: float, unit: str, base_name: str, base: float, base_unit: str) -> str:
    return f"{figure}: {value:.0f} {unit} (baseline {base_name} {base:.0f} {base_unit}, ratio {value / base:.2f})"


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-pki-"))
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the database and key files of this run, whatever happened


def run(tmp: Path) -> None:
    progress = Progress("pki")
    db = Database(sqlite_url(tmp))
    migrate(db.engine)
    ks = FileKeyStore.open(tmp / "keys", key_file=FileKeyStore.create_key_file(tmp / "master.key"))
    now = datetime.now(UTC)
    with db.session() as s:
        service.init_trust_domain(s, ks, trust_domain=TD)
        s.add(Tenant(slug="acme", display_name="acme", created_at=now))
        s.flush()
        s.add(WorkloadGroup(tenant="acme", name="web", created_at=now))
        s.add(Workload(tenant="acme", group="web", name="w", spiffe_id=f"spiffe://{TD}/tenant/acme/group/web/w",
                       created_at=now))
    csrs = [_csr() for _ in range(N)]

    def issue_run() -> float:
        it = iter(csrs)

        def one() -> None:
            with db.session() as s:
                service.issue_x509_svid(s, ks, csr_pem=next(it), tenant="acme", group="web", workload="w",
                                        ttl=None, actor=ACTOR, scope_tenant=None, clock=system_clock)
        return _rate(one, N)

    def jwt_run() -> float:
        def one() -> None:
            with db.session() as s:
                service.issue_jwt_svid(s, ks, tenant="acme", group="web", workload="w", audience=["a"], ttl=None,
                                       actor=ACTOR, scope_tenant=None, clock=system_clock)
        return _rate(one, N)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    leaf_pub = ec.generate_private_key(ec.SECP256R1()).public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])

    def raw_cert_run() -> float:
        def one() -> None:
            (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(leaf_pub)
             .serial_number(x509.random_serial_number()).not_valid_before(now)
             .not_valid_after(now + timedelta(hours=1))
             .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TD}/w")]),
                            critical=False)
             .sign(ca_key, hashes.SHA256()))
        return _rate(one, N * 5)

    def raw_sign_run() -> float:
        return _rate(lambda: ca_key.sign(b"x" * 300, ec.ECDSA(hashes.SHA256())), N * 5)

    def raw_jwt_run() -> float:
        claims = {"sub": f"spiffe://{TD}/w", "aud": ["a"], "exp": 2_000_000_000, "iat": 1_900_000_000}
        return _rate(lambda: jwt.encode(claims, ca_key, algorithm="ES256", headers={"kid": "k"}), N * 5)

    progress.step("X.509-SVID issuance")
    issue = _median(issue_run)
    raw_cert = _median(raw_cert_run)
    raw_sign = _median(raw_sign_run)
    progress.step("JWT-SVID minting")
    jwt_rate = _median(jwt_run)
    raw_jwt = _median(raw_jwt_run)
    print(f"# scale: {RUNS} runs x {N} issuances (one committed transaction each), SQLite WAL, file key store, "
          "ECDSA P-256; medians")
    print(line("x509-svid issued (service)", issue, "svid/s", "raw CertificateBuilder.sign P-256", raw_cert, "cert/s"))
    print(line("x509-svid issued vs raw sign", issue, "svid/s", "raw ECDSA P-256 sign", raw_sign, "sig/s"))
    print(line("jwt-svid minted (service)", jwt_rate, "jwt/s", "raw jwt.encode ES256", raw_jwt, "jwt/s"))
    progress.done()
    db.dispose()


if __name__ == "__main__":
    main()
