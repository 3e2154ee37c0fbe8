"""mTLS over a real uvicorn (TLS on 127.0.0.1, a free port) with a real ssl client: an X.509-SVID
(parsed by py-spiffe) is the principal; a revoked one, one from another trust domain and a self-signed
one are refused."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from spiffe import X509Svid

from api.auth.mtls import PeerCertH11Protocol
from api.tls import ServerTls, prepare_server_tls
from audit import Actor
from pki.service import issue_x509_svid
from tests.api.conftest import Env, make_settings, open_env, seed

pytestmark = pytest.mark.xdist_group("mtls")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_csr() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "w")])).sign(key, hashes.SHA256())
    return key, csr.public_bytes(serialization.Encoding.PEM)


def issue_svid(env: Env, tmp: Path, name: str, tenant: str = "acme", group: str = "web",
               workload: str = "web-1", td: str = "example.org") -> tuple[Path, Path, str]:
    """A workload SVID, checked by py-spiffe, written where an ssl client can load it."""
    key, csr = new_csr()
    with env.ctx.db.session() as s:
        issued = issue_x509_svid(s, env.ctx.keystore, csr_pem=csr, tenant=tenant, group=group, workload=workload,
                                 ttl=None, actor=Actor.system("t"), scope_tenant=None, clock=env.clock)
    svid = X509Svid.parse(issued.full_chain_pem, key_pem(key))
    assert str(svid.spiffe_id) == f"spiffe://{td}/tenant/{tenant}/group/{group}/{workload}"
    cert, kfile = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert.write_bytes(issued.full_chain_pem)
    kfile.write_bytes(key_pem(key))
    kfile.chmod(0o600)
    return cert, kfile, issued.serial


class TlsServer:
    def __init__(self, env: Env, tls: ServerTls) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            env.app, host="127.0.0.1", port=self.port, log_level="warning", http=PeerCertH11Protocol,
            ssl_certfile=str(tls.certfile), ssl_keyfile=str(tls.keyfile), ssl_keyfile_password=tls.password,
            ssl_ca_certs=str(tls.ca_file), ssl_cert_reqs=ssl.CERT_OPTIONAL, lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Env, TlsServer, ServerTls]]:
    env = open_env(make_settings(tmp_path / "home"))
    seed(env)
    tls = prepare_server_tls(env.ctx)
    server = TlsServer(env, tls)
    yield env, server, tls
    server.stop()
    tls.cleanup()
    env.client.close()
    env.ctx.close()


def client_ctx(tls: ServerTls, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls.ca_file))  # verify the server's SVID too
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


HANDSHAKE_REFUSED = (ssl.SSLError, httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)


def refused(server: TlsServer, ctx: ssl.SSLContext) -> bool:
    """True when the server refuses the client certificate during or right after the handshake."""
    try:
        get(server, ctx)
    except HANDSHAKE_REFUSED:
        return True
    return False


def get(server: TlsServer, ctx: ssl.SSLContext, path: str = "/v1/whoami", **kw: object) -> httpx.Response:
    with httpx.Client(verify=ctx, timeout=10) as client:
        return client.get(f"https://localhost:{server.port}{path}", **kw)  # type: ignore[arg-type]


def test_server_presents_its_svid(served: tuple[Env, TlsServer, ServerTls]) -> None:
    _env, server, tls = served
    r = get(server, client_ctx(tls), "/healthz")
    assert r.status_code == 200
    assert tls.spiffe_id == "spiffe://example.org/trustfabric/server"
    # without a client certificate or token: 401
    r = get(server, client_ctx(tls))
    assert r.status_code == 401


def test_workload_svid_is_the_principal_and_revocation_refuses_it(
    served: tuple[Env, TlsServer, ServerTls], tmp_path: Path
) -> None:
    env, server, tls = served
    cert, key, serial = issue_svid(env, tmp_path, "web-1")
    r = get(server, client_ctx(tls, cert, key))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "spiffe://example.org/tenant/acme/group/web/web-1", "role": "workload",
                        "tenant": "acme", "auth": "mtls"}
    # a second workload SVID, then the first one's serial is revoked
    cert2, key2, _ = issue_svid(env, tmp_path, "api-1", tenant="globex", group="api", workload="api-1")
    r = env.call("POST", "/v1/svids/revoke", "security", json={"serial": serial, "reason": "key leaked"})
    assert r.status_code == 200, r.text
    r = get(server, client_ctx(tls, cert, key))
    assert r.status_code == 401 and "revoked" in r.json()["reason"]
    assert get(server, client_ctx(tls, cert2, key2)).status_code == 200


def test_other_trust_domain_and_self_signed_refused(
    served: tuple[Env, TlsServer, ServerTls], tmp_path: Path
) -> None:
    _env, server, tls = served
    # an SVID from another trust domain, and one from a second CA of the same name (not ours either)
    for name, td in (("foreign", "other.example"), ("twin", "example.org")):
        other = open_env(make_settings(tmp_path / name), td=td)
        try:
            seed(other, td=td)
            cert, key, _ = issue_svid(other, tmp_path, name, td=td)
        finally:
            other.client.close()
            other.ctx.close()
        assert refused(server, client_ctx(tls, cert, key)), name

    # a self-signed certificate carrying our SPIFFE ID
    skey = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "self")])
    now = datetime.now(UTC)
    self_signed = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(skey.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(
            "spiffe://example.org/tenant/acme/group/web/web-1")]), critical=False)
        .sign(skey, hashes.SHA256())
    )
    scert, skeyf = tmp_path / "self.pem", tmp_path / "self.key"
    scert.write_bytes(self_signed.public_bytes(serialization.Encoding.PEM))
    skeyf.write_bytes(key_pem(skey))
    assert refused(server, client_ctx(tls, scert, skeyf))
    # and the server is still fine for a good client afterwards
    assert get(server, client_ctx(tls), "/healthz").status_code == 200


def test_node_svid_is_a_node_principal(served: tuple[Env, TlsServer, ServerTls], tmp_path: Path) -> None:
    from pki.service import attest_node, create_join_token

    env, server, tls = served
    key, csr = new_csr()
    with env.ctx.db.session() as s:
        join = create_join_token(s, node_name="gpu-01", actor=Actor.system("t"), clock=env.clock)
    with env.ctx.db.session() as s:
        issued = attest_node(s, env.ctx.keystore, token=join, csr_pem=csr, clock=env.clock)
    cert, kfile = tmp_path / "node.pem", tmp_path / "node.key"
    cert.write_bytes(issued.full_chain_pem)
    kfile.write_bytes(key_pem(key))
    r = get(server, client_ctx(tls, cert, kfile))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "spiffe://example.org/node/gpu-01", "role": "node", "tenant": None, "auth": "mtls"}
    # a node reads the revocation deny list, and nothing of the tenants' grants
    ctx = client_ctx(tls, cert, kfile)
    assert get(server, ctx, "/v1/revocations").status_code == 200
    assert get(server, ctx, "/v1/grants").status_code == 403


def test_roots_rotated_in_are_trusted_without_a_restart(
    served: tuple[Env, TlsServer, ServerTls], tmp_path: Path
) -> None:
    """After a CA rotation, SVIDs of the new generation chain to a root the server did not load at start:
    refused until the background job adds the bundle's new roots to the live TLS context, then accepted."""
    from api.tls import refresh_trust_anchors
    from pki.service import rotate

    env, server, tls = served
    old_cert, old_key, _ = issue_svid(env, tmp_path, "before")
    assert get(server, client_ctx(tls, old_cert, old_key)).status_code == 200  # the server sees its context
    with env.ctx.db.session() as s:
        status = rotate(s, env.ctx.keystore, force=True, actor=Actor.system("t"), clock=env.clock)
    assert status.activated is not None
    new_cert, new_key, _ = issue_svid(env, tmp_path, "after")
    assert refused(server, client_ctx(tls, new_cert, new_key))  # only the start-up roots are trusted
    assert refresh_trust_anchors(env.ctx, env.app.state.trust_anchors) >= 1
    r = get(server, client_ctx(tls, new_cert, new_key))
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "spiffe://example.org/tenant/acme/group/web/web-1"
    assert get(server, client_ctx(tls, old_cert, old_key)).status_code == 200  # the old generation still works
    assert refresh_trust_anchors(env.ctx, env.app.state.trust_anchors) == 0  # nothing new: nothing added again
