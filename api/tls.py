"""TLS material for `trustfabric serve --tls`: the server's own SVID (issued by pki at start-up, key kept
only in memory and, for uvicorn, in a private file encrypted under a random one-time password) and the
trust domain's roots as the client-certificate trust anchors."""

from __future__ import annotations

import secrets
import shutil
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from audit import Actor
from workflows.context import AppContext


@dataclass
class ServerTls:
    directory: Path
    certfile: Path
    keyfile: Path
    password: str
    ca_file: Path
    spiffe_id: str

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def prepare_server_tls(ctx: AppContext, *, hosts: tuple[str, ...] = ("localhost",),
                       ips: tuple[str, ...] = ("127.0.0.1",)) -> ServerTls:
    from pki.service import bundle_pem, issue_server_svid

    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trustfabric-api")]))
        .sign(key, hashes.SHA256())
    )
    with ctx.db.session() as session:
        issued = issue_server_svid(
            session, ctx.keystore, csr_pem=csr.public_bytes(serialization.Encoding.PEM), dns_names=hosts,
            ip_addresses=ips, actor=Actor.system("api-server"), clock=ctx.clock,
        )
        roots = bundle_pem(session, clock=ctx.clock)
    directory = Path(tempfile.mkdtemp(prefix="tf-tls-"))
    directory.chmod(0o700)
    password = secrets.token_urlsafe(32)
    keyfile = directory / "server.key"
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode()),
    ))
    certfile = directory / "server.pem"
    certfile.write_bytes(issued.full_chain_pem)
    ca_file = directory / "roots.pem"
    ca_file.write_bytes(roots)
    return ServerTls(directory, certfile, keyfile, password, ca_file, issued.spiffe_id)


class TrustAnchors:
    """Keeps the live server SSLContexts trusting every root the bundle publishes. One per app (create_app
    makes it; the TLS protocol and the background job are handed it), never a module global.

    uvicorn loads the client-certificate trust anchors once at start; after a CA rotation the next
    generation's root (published in the bundle from the moment it is prepared, days before it signs
    anything) must be trusted without a restart. OpenSSL lets roots be added to a live context, so the
    server's background job adds the new ones. Retired roots stay loaded until restart, which is safe:
    the mTLS authenticator still requires a serial this server issued, unrevoked and unexpired.
    """

    def __init__(self) -> None:
        # each watched context with the fingerprints of the roots added to it so far
        self._contexts: list[tuple[ssl.SSLContext, set[bytes]]] = []
        self._lock = threading.Lock()

    def watch(self, context: ssl.SSLContext) -> None:
        with self._lock:
            if all(c is not context for c, _ in self._contexts):
                self._contexts.append((context, set()))

    def refresh(self, roots_pem: bytes) -> int:
        """Adds each root a watched context does not trust yet; returns how many additions were made."""
        certs = x509.load_pem_x509_certificates(roots_pem) if roots_pem.strip() else []
        added = 0
        with self._lock:
            for cert in certs:
                fingerprint = cert.fingerprint(hashes.SHA256())
                pem = cert.public_bytes(serialization.Encoding.PEM).decode()
                for context, loaded in self._contexts:
                    if fingerprint not in loaded:
                        context.load_verify_locations(cadata=pem)
                        loaded.add(fingerprint)
                        added += 1
        return added


def refresh_trust_anchors(ctx: AppContext, anchors: TrustAnchors) -> int:
    """Add the bundle's roots the watched contexts do not trust yet (the background job, every rotation check)."""
    from pki.service import bundle_pem

    with ctx.db.read_session() as session:
        roots = bundle_pem(session, clock=ctx.clock)
    return anchors.refresh(roots)


def anchors_of(app: object) -> TrustAnchors | None:
    """The TrustAnchors create_app made for this app, found through the ASGI wrappers a server adds."""
    for _ in range(8):
        state = getattr(app, "state", None)
        anchors = getattr(state, "trust_anchors", None) if state is not None else None
        if isinstance(anchors, TrustAnchors):
            return anchors
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None
