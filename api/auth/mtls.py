"""mTLS: the client certificate (already chained to our trust domain's roots by the TLS handshake) is the
principal: its SPIFFE ID (exactly one URI SAN) names a node or a workload. Revoked serials and revoked
identities are refused with 401.

uvicorn does not put the peer certificate into the ASGI scope, so the `PeerCert` protocols read it from
the TLS transport once per connection and hand it to every request of that connection through the
scope's `state` (uvicorn copies the protocol's app state into each request scope). `serve` runs the
httptools one (api/server.py); the h11 one stays for servers that ask for it by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import TYPE_CHECKING, Any

from cryptography import x509
from fastapi import Request
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.principal import Principal, principal_from_spiffe_id
from api.tls import anchors_of
from core.errors import Unauthenticated

if TYPE_CHECKING:
    from workflows.context import AppContext

log = logging.getLogger("trustfabric.api.mtls")

PEER_CERT_KEY = "tf_peer_cert_der"


class PeerCert(asyncio.Protocol):
    """Mixed into a uvicorn HTTP protocol: the verified peer certificate (DER) in each request's scope state,
    and TCP_NODELAY on every connection."""

    config: Config
    app: Any
    app_state: dict[str, Any]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # With --workers, uvicorn hands the listening socket to its children in a form asyncio does not
        # recognise as TCP, so it skips TCP_NODELAY; without it every response waits ~40 ms for the
        # client's delayed ACK (headers and body are separate writes).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(self.config.ssl, ssl.SSLContext):
            anchors = anchors_of(self.app)
            if anchors is not None:
                anchors.watch(self.config.ssl)  # so rotated-in roots are trusted without a restart
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der:
            self.app_state = {**self.app_state, PEER_CERT_KEY: der}


class PeerCertH11Protocol(PeerCert, H11Protocol):
    """uvicorn's h11 protocol with PeerCert."""


class PeerCertHttpToolsProtocol(PeerCert, HttpToolsProtocol):
    """uvicorn's httptools protocol with PeerCert (several times cheaper per request than h11)."""


def peer_certificate(request: Request) -> bytes | None:
    state = request.scope.get("state") or {}
    der = state.get(PEER_CERT_KEY) if isinstance(state, dict) else None
    return der if isinstance(der, bytes) else None


def spiffe_id_of(cert: x509.Certificate) -> str:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise Unauthenticated("client certificate has no SPIFFE ID (no subject alternative name)") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1 or not uris[0].startswith("spiffe://"):
        raise Unauthenticated("client certificate must carry exactly one spiffe:// URI SAN")
    return uris[0]


class MtlsAuthenticator:
    """Principal from the TLS client certificate; None when the connection carried none."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def __call__(self, ctx: AppContext, request: Request) -> Principal | None:
        der = peer_certificate(request)
        if der is None:
            return None
        return self.authenticate_der(der)

    def authenticate_der(self, der: bytes) -> Principal:
        from pki.models import IssuedSvid
        from pki.revocation import identity_revoked
        from pki.spiffe_id import parse_spiffe_id
        from workflows.context import trust_domain

        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            raise Unauthenticated("client certificate is not valid DER") from None
        spiffe_id = spiffe_id_of(cert)
        now = self.ctx.clock()
        if not (cert.not_valid_before_utc <= now < cert.not_valid_after_utc):
            raise Unauthenticated("client certificate is not valid now")
        serial = format(cert.serial_number, "x")
        with self.ctx.db.read_session() as session:
            td = trust_domain(self.ctx, session)
            principal = principal_from_spiffe_id(spiffe_id, td, "mtls")
            svid = session.get(IssuedSvid, serial)
            if svid is None:
                raise Unauthenticated(f"client certificate serial {serial} was not issued by this server")
            if svid.revoked_at is not None:
                raise Unauthenticated(f"client certificate serial {serial} is revoked")
            if svid.spiffe_id != spiffe_id:
                raise Unauthenticated("client certificate does not match the SVID issued under its serial")
            if principal.tenant is not None and identity_revoked(session, parse_spiffe_id(spiffe_id), principal.tenant):
                raise Unauthenticated(f"identity {spiffe_id} is revoked")
        return principal
