"""The SPIFFE Workload API (gRPC service `SpiffeWorkloadAPI`, stubs from py-spiffe's `spiffe._proto`) on a
unix socket, as the SPIFFE Workload Endpoint and Workload API specifications describe it:

- every call must carry the metadata `workload.spiffe.io: true`, else INVALID_ARGUMENT (a browser or a
  confused proxy cannot be made to call it);
- the caller is attested by the kernel's credentials for its connection (agent/peercred.py) against the
  selectors of the workloads placed on this node; a caller that matches none gets PERMISSION_DENIED
  ("no identity issued"), as SPIRE answers;
- FetchX509SVID and FetchX509Bundles, FetchJWTBundles stream: the first answer at once, then a new one
  whenever what the caller would get changes (an SVID renewed at half life, the bundle after a CA rotation,
  the workload placed or removed); FetchJWTSVID and ValidateJWTSVID answer once;
- a restarted agent answers UNAVAILABLE ("retry") until it re-synced its cached SVIDs with the server
  (agent/svids.py), never from an unconfirmed cache; so does FetchX509SVID for a caller none of whose workloads
  holds a valid X.509-SVID while the server cannot issue one (rate limited, down, unreachable: `RetryLater`).
  PERMISSION_DENIED stays for "no identity for you" (nothing placed for the caller, or the server refused it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from google.protobuf import struct_pb2  # type: ignore[import-untyped]
from spiffe._proto import workload_pb2, workload_pb2_grpc

from agent.identity import NodeIdentity, roots_of
from agent.metrics import AgentMetrics
from agent.peercred import Caller, PeerCredRelay
from agent.svids import NotSynced, RetryLater, WorkloadSvids
from pki.errors import InvalidSpiffeId
from pki.spiffe_id import SpiffeId, parse_spiffe_id

log = logging.getLogger("trustfabric.agent.workload_api")

HEADER = ("workload.spiffe.io", "true")
STREAM_POLL = 1.0  # seconds between checks of a streaming caller's answer (and of the client still being there)
# JWT-SVID spec 2.1: RFC 7518 3.3-3.5 only (RSA PKCS#1, ECDSA, RSA-PSS); any other `alg` (EdDSA, HS*, none) is refused
JWT_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"]
JWT_TYPES = ("JWT", "JOSE")  # JWT-SVID spec 2.3: `typ` is optional, and one of these when set


class WorkloadApi(workload_pb2_grpc.SpiffeWorkloadAPIServicer):
    def __init__(self, identity: NodeIdentity, svids: WorkloadSvids, metrics: AgentMetrics,
                 relay: PeerCredRelay | None = None) -> None:
        self.identity = identity
        self.svids = svids
        self.metrics = metrics
        self.relay = relay

    # ------------------------------------------------------------------ caller
    def _caller(self, context: grpc.ServicerContext, method: str) -> Caller:
        if (HEADER[0], HEADER[1]) not in tuple((k, v) for k, v in context.invocation_metadata()):
            self.metrics.workload_requests.labels(method, "no-header").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        caller = self.relay.caller(context.peer()) if self.relay is not None else None
        if caller is None:
            self.metrics.workload_requests.labels(method, "unattested").inc()
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "caller not attested: connect through the socket")
        assert caller is not None
        return caller

    def _placements(self, caller: Caller, context: grpc.ServicerContext) -> list[Any]:
        try:
            return self.svids.for_caller(caller.matcher())  # the executable confirmed once for all placements
        except NotSynced as exc:  # a restarted agent's cache is not served before the server confirmed it
            self.metrics.workload_requests.labels("any", "not-synced").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # abort raises; this is for the type checker

    def _deny(self, context: grpc.ServicerContext, method: str) -> None:
        self.metrics.workload_requests.labels(method, "denied").inc()
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")

    def _bundle_der(self) -> bytes:
        bundle = self.identity.bundle or {}
        return b"".join(c.public_bytes(serialization.Encoding.DER) for c in roots_of(bundle))

    def _td_id(self) -> str:
        """The key of a bundle map: the trust domain's SPIFFE ID, `spiffe://<td>` (workloadapi.proto, Workload API
        spec 6.3), as SPIRE sends it; a bare name is accepted by lenient clients only."""
        return str(SpiffeId(self.identity.trust_domain, ""))

    def _jwks(self) -> dict[str, Any]:
        bundle = self.identity.bundle or {}
        return {"keys": [{k: v for k, v in key.items() if k != "use"} for key in bundle.get("keys") or []
                         if isinstance(key, dict) and key.get("use") == "jwt-svid"]}

    def _stream(self, context: grpc.ServicerContext, method: str, answer: Any) -> Iterator[Any]:
        """Send `answer()` now and again whenever it changes, until the client goes away."""
        last: bytes | None = None
        while context.is_active():
            seen = self.svids.version, self.identity.generation
            msg = answer()
            if msg is None:
                self._deny(context, method)
            wire = msg.SerializeToString(deterministic=True)
            if wire != last:
                self.metrics.workload_requests.labels(method, "ok").inc()
                last = wire
                yield msg
            deadline = time.monotonic() + STREAM_POLL
            while context.is_active() and time.monotonic() < deadline:
                if (self.svids.wait_change(seen[0], 0.2), self.identity.generation) != seen:
                    break

    # ------------------------------------------------------------------ X.509
    def _x509_response(self, caller: Caller, context: grpc.ServicerContext) -> workload_pb2.X509SVIDResponse | None:
        placements = self._placements(caller, context)
        self.svids.renew_behind([p.workload for p in placements])  # its own, and never waited for while valid
        bundle = self._bundle_der()
        out = []
        later: RetryLater | None = None
        for p in placements:
            try:
                entry = self.svids.x509(p.workload, held_ok=True)
            except RetryLater as exc:  # none held, and the server cannot issue one just now
                later = exc
                continue
            if entry is not None:
                out.append(workload_pb2.X509SVID(spiffe_id=entry.spiffe_id, x509_svid=entry.chain_der,
                                                 x509_svid_key=entry.key_der, bundle=bundle))
        if not out and later is not None:
            self.metrics.workload_requests.labels("FetchX509SVID", "unavailable").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, str(later))
        return workload_pb2.X509SVIDResponse(svids=out) if out else None

    def FetchX509SVID(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        caller = self._caller(context, "FetchX509SVID")
        yield from self._stream(context, "FetchX509SVID", lambda: self._x509_response(caller, context))

    def FetchX509Bundles(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        caller = self._caller(context, "FetchX509Bundles")

        def answer() -> Any:
            if not self._placements(caller, context):
                return None
            return workload_pb2.X509BundlesResponse(bundles={self._td_id(): self._bundle_der()})

        yield from self._stream(context, "FetchX509Bundles", answer)

    # ------------------------------------------------------------------ JWT
    def FetchJWTSVID(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, "FetchJWTSVID")
        audience = [a for a in request.audience if a]
        if not audience:
            self.metrics.workload_requests.labels("FetchJWTSVID", "bad-request").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "audience must be specified")
        if request.spiffe_id:
            # a malformed request is InvalidArgument (Workload Endpoint spec 6); PermissionDenied stays for a
            # well-formed ID this caller is not entitled to (Workload API spec 6.2.1)
            try:
                parse_spiffe_id(request.spiffe_id)
            except InvalidSpiffeId as exc:
                self.metrics.workload_requests.labels("FetchJWTSVID", "bad-request").inc()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spiffe_id is malformed: {exc}")
        placements = [p for p in self._placements(caller, context)
                      if not request.spiffe_id or p.spiffe_id == request.spiffe_id]
        svids = []
        later: RetryLater | None = None
        for p in placements:
            try:
                entry = self.svids.jwt(p.workload, audience, held_ok=True)
            except RetryLater as exc:  # none held, and the server cannot issue one just now
                later = exc
                continue
            if entry is not None:
                svids.append(workload_pb2.JWTSVID(spiffe_id=entry.spiffe_id, svid=entry.token))
        if not svids and later is not None:
            self.metrics.workload_requests.labels("FetchJWTSVID", "unavailable").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, str(later))
        if not svids:
            self._deny(context, "FetchJWTSVID")
        self.metrics.workload_requests.labels("FetchJWTSVID", "ok").inc()
        return workload_pb2.JWTSVIDResponse(svids=svids)

    def FetchJWTBundles(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        caller = self._caller(context, "FetchJWTBundles")

        def answer() -> Any:
            if not self._placements(caller, context):
                return None
            jwks = json.dumps(self._jwks(), sort_keys=True).encode()
            return workload_pb2.JWTBundlesResponse(bundles={self._td_id(): jwks})

        yield from self._stream(context, "FetchJWTBundles", answer)

    def ValidateJWTSVID(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._caller(context, "ValidateJWTSVID")
        if not request.audience or not request.svid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "audience and svid must be specified")
        try:
            claims = self._validate(request.svid, request.audience)
        except (jwt.PyJWTError, ValueError, KeyError) as exc:
            self.metrics.workload_requests.labels("ValidateJWTSVID", "invalid").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid JWT-SVID: {exc}")
        self.metrics.workload_requests.labels("ValidateJWTSVID", "ok").inc()
        struct = struct_pb2.Struct()
        struct.update(claims)
        return workload_pb2.ValidateJWTSVIDResponse(spiffe_id=str(claims["sub"]), claims=struct)

    def _validate(self, token: str, audience: str) -> dict[str, Any]:
        header = jwt.get_unverified_header(token)
        if "typ" in header and header["typ"] not in JWT_TYPES:
            raise ValueError(f"typ {header['typ']!r} is neither JWT nor JOSE")
        kid = header.get("kid")
        key = next((k for k in self._jwks()["keys"] if k.get("kid") == kid), None)
        if key is None:
            raise ValueError(f"no key {kid!r} in the trust bundle")
        claims: dict[str, Any] = jwt.decode(token, jwt.PyJWK(key).key, algorithms=JWT_ALGORITHMS, audience=audience,
                                            options={"require": ["sub", "aud", "exp"]})
        try:  # sub is a SPIFFE ID (JWT-SVID spec 3.1): parsed by the spec's rules, not matched as a string prefix
            sub = parse_spiffe_id(claims["sub"])
        except InvalidSpiffeId as exc:
            raise ValueError(f"sub is not a SPIFFE ID: {exc}") from None
        if sub.trust_domain != self.identity.trust_domain or not sub.path:
            raise ValueError("the subject is not a workload of this trust domain")
        return claims


class WorkloadApiServer:
    """The gRPC server on loopback behind the peer-credential relay on the unix socket."""

    def __init__(self, socket_path: Path, identity: NodeIdentity, svids: WorkloadSvids, metrics: AgentMetrics,
                 max_workers: int = 64) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="wlapi"))
        self.servicer = WorkloadApi(identity, svids, metrics)
        workload_pb2_grpc.add_SpiffeWorkloadAPIServicer_to_server(self.servicer, self.server)  # type: ignore[no-untyped-call]
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.relay = PeerCredRelay(socket_path, port)
        self.servicer.relay = self.relay
        self.socket_path = socket_path

    @property
    def endpoint(self) -> str:
        """The socket as a workload's SPIFFE_ENDPOINT_SOCKET wants it (Workload Endpoint spec 4): a `unix` URI with
        no authority and the absolute path, `unix:///run/x/api.sock` (a relative path is no URI path here)."""
        return f"unix://{self.socket_path.absolute()}"

    def stop(self) -> None:
        self.relay.close()
        self.server.stop(grace=0.5).wait(5)
