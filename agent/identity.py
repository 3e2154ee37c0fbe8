"""The node's identity in its data directory: attest once with a join token, then live on the node SVID.

Files (the directory is 0711: not listable, traversable to the Workload API socket below it; each file
0600, written to a temporary name and renamed, so a crash leaves the old or the new one, never half of one):
  node.pem     the node's private key and its SVID chain in ONE file, so a renewal swaps key and certificate
               together (ssl's load_cert_chain reads both from it, the key's password from agent.at_rest).
               The key is made here and never leaves: the server sees a CSR. It is encrypted PKCS#8 under
               the agent's key file (agent/at_rest.py: never a plaintext private key on disk); a node.pem
               of an older agent with a plaintext key is encrypted in place at the first start. Never logged.
  bundle.json  the trust bundle (SPIFFE JWKS: the X.509 roots as x5c, the JWT-SVID keys), fetched from the
               server over the verified connection and refreshed, so roots prepared by a CA rotation are
               trusted before they sign anything. The `--ca` file stays a trust anchor beside it.

Renewal: at half life (`renew_due`), with a fresh key, over mTLS with the current SVID (POST /v1/nodes/renew);
the new file replaces the old one only once the server answered, so nothing is dropped meanwhile.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.at_rest import AtRest
from core.errors import TrustfabricError
from core.files import write_private_file
from pki.errors import InvalidSpiffeId
from pki.spiffe_id import parse_spiffe_id

log = logging.getLogger("trustfabric.agent")

NODE_FILE = "node.pem"
BUNDLE_FILE = "bundle.json"


class AgentError(TrustfabricError):
    """The agent cannot go on: what is wrong and what to do."""


def new_key_and_csr(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])).sign(key, hashes.SHA256())
    return key, csr.public_bytes(serialization.Encoding.PEM).decode()


def key_der(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 DER, for memory only (the Workload API hands it to the workload; never written as it is)."""
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def sealed_key_pem(key: ec.EllipticCurvePrivateKey, password: bytes) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.BestAvailableEncryption(password))


def chain_pem(issued: dict[str, Any]) -> bytes:
    """The leaf then its chain, as the SVID endpoints answer them."""
    return (str(issued["certificate"]) + "".join(str(c) for c in issued.get("chain") or [])).encode()


def roots_of(bundle: dict[str, Any]) -> list[x509.Certificate]:
    """The X.509 roots of a SPIFFE bundle: the first x5c value of each x509-svid key; X509-SVID spec 6.2 says
    the others MUST be ignored (they are the root's own issuers, not anchors of this trust domain)."""
    out = []
    for k in bundle.get("keys") or []:
        if isinstance(k, dict) and k.get("use") == "x509-svid" and k.get("x5c"):
            out.append(x509.load_der_x509_certificate(base64.b64decode(k["x5c"][0])))
    if not out:
        raise AgentError("the trust bundle holds no X.509 root")
    return out


@dataclass(frozen=True)
class Svid:
    """The node's current SVID: its chain, key and validity."""

    pem: bytes  # key + chain, as stored
    spiffe_id: str
    not_before: datetime
    not_after: datetime

    def renew_due(self) -> datetime:
        return self.not_before + (self.not_after - self.not_before) / 2


PLAIN_KEY = b"-----BEGIN PRIVATE KEY-----"
SEALED_KEY = b"-----BEGIN ENCRYPTED PRIVATE KEY-----"


def parse_node_pem(data: bytes, node: str, password: bytes) -> Svid:
    certs = x509.load_pem_x509_certificates(data)
    if SEALED_KEY not in data:
        raise AgentError("the stored node SVID holds no encrypted private key")
    try:
        serialization.load_pem_private_key(data, password=password)  # it must hold the key, sealed with ours
    except (ValueError, TypeError):
        raise AgentError("the node key in the data directory does not open with the agent key file (another "
                         "key file?): restore it, or start over with a new data directory and join token") from None
    leaf = certs[0]
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sid = parse_spiffe_id(san.get_values_for_type(x509.UniformResourceIdentifier)[0])
    except (x509.ExtensionNotFound, IndexError, InvalidSpiffeId) as exc:
        raise AgentError(f"the stored node SVID carries no valid SPIFFE ID ({exc})") from None
    if sid.segments != ("node", node):
        raise AgentError(f"the data directory holds the SVID of {sid}, not of node {node}: use another --data-dir")
    return Svid(data, str(sid), leaf.not_valid_before_utc, leaf.not_valid_after_utc)


class NodeIdentity:
    """The node SVID and trust bundle on disk, and the TLS context made from them (rebuilt on every change)."""

    def __init__(self, data_dir: Path, node: str, ca_file: Path, at_rest: AtRest) -> None:
        self.dir = Path(data_dir)
        self.node = node
        self.ca_file = Path(ca_file)
        self.at_rest = at_rest
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(self.dir, 0o711)  # noqa: S103 -- traversable (the Workload API socket lives below), not listable
        self._lock = threading.Lock()
        self.generation = 0  # bumped on every change of SVID or bundle: clients rebuild their connection
        self.svid: Svid | None = None
        self.bundle: dict[str, Any] | None = None
        path = self.dir / NODE_FILE
        if path.exists():
            data = path.read_bytes()
            if PLAIN_KEY in data:
                data = self._seal_plaintext(data)
            self.svid = parse_node_pem(data, node, at_rest.password())
        bundle_path = self.dir / BUNDLE_FILE
        if bundle_path.exists():
            self.bundle = json.loads(bundle_path.read_text(encoding="utf-8"))

    def _seal_plaintext(self, data: bytes) -> bytes:
        """Migration: an older agent's node.pem held the key in plaintext (mode 0600); encrypt it in place (one
        atomic replace: the old file or the new one, never neither)."""
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise AgentError(f"the stored node key does not parse ({exc})") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise AgentError("the stored node key is not an EC key")
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in x509.load_pem_x509_certificates(data))
        sealed = sealed_key_pem(key, self.at_rest.password()) + chain
        parse_node_pem(sealed, self.node, self.at_rest.password())
        write_private_file(self.dir / NODE_FILE, sealed, overwrite=True)
        log.info("node %s: the plaintext node key in %s is now encrypted at rest", self.node, self.dir / NODE_FILE)
        return sealed

    @property
    def trust_domain(self) -> str:
        if self.svid is None:
            raise AgentError("the node has no SVID yet: attest with a join token first")
        return parse_spiffe_id(self.svid.spiffe_id).trust_domain

    def roots_pem(self) -> str:
        """The trust anchors for the server's certificate: the fetched bundle's roots and the --ca file (an
        agent that was down through a whole CA rotation finds its way back through the operator's anchor)."""
        bundle = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in roots_of(self.bundle)) \
            if self.bundle is not None else ""
        try:
            return bundle + self.ca_file.read_text(encoding="utf-8")
        except OSError as exc:
            if bundle:
                return bundle
            raise AgentError(f"--ca {self.ca_file}: {exc.strerror}") from None

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.roots_pem())
        if client_cert:
            if self.svid is None:
                raise AgentError("the node has no SVID yet: attest with a join token first")
            # load_cert_chain reads files only: hand it the stored file (key + chain), never a copy
            ctx.load_cert_chain(str(self.dir / NODE_FILE), password=self.at_rest.password())
        return ctx

    def store_svid(self, key: ec.EllipticCurvePrivateKey, issued: dict[str, Any]) -> Svid:
        """Keep a newly issued SVID with its key (one atomic file), then make it current."""
        data = sealed_key_pem(key, self.at_rest.password()) + chain_pem(issued)
        svid = parse_node_pem(data, self.node, self.at_rest.password())
        with self._lock:
            write_private_file(self.dir / NODE_FILE, data, overwrite=True)
            self.svid = svid
            self.generation += 1
        return svid

    def store_bundle(self, bundle: dict[str, Any]) -> bool:
        """Keep a fetched bundle; True when it changed."""
        roots_of(bundle)  # refuse one without roots before it replaces anything
        with self._lock:
            if bundle == self.bundle:
                return False
            write_private_file(self.dir / BUNDLE_FILE, json.dumps(bundle, sort_keys=True).encode(), overwrite=True)
            self.bundle = bundle
            self.generation += 1
            return True
