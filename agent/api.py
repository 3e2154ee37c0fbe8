"""The agent's HTTPS client: mTLS with the node SVID, the server verified against the trust bundle.

The connection pool is rebuilt whenever the identity changes (a renewed SVID, a refreshed bundle); requests
in flight finish on the old pool, which is closed once the next request of every thread moved on.
Errors: `Unreachable` (no answer: the caller keeps what it has and retries later) and `Refused` (an answer
that is not a success, with the server's reason, and its Retry-After when it sent one).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from cryptography import x509

from agent.identity import AgentError, NodeIdentity, new_key_and_csr
from core.digits import is_digits

VIEW_KEY = "x-fabric-view"


class Unreachable(AgentError):
    """The server did not answer (connection refused, timeout, TLS failure)."""


class Refused(AgentError):
    """The server answered with an error status."""

    def __init__(self, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.retry_after = retry_after  # seconds, from the answer's Retry-After (429, 503); None when it sent none


def retry_after(r: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds (RFC 9110 10.2.3: delay-seconds or an HTTP-date); None when absent or
    unreadable."""
    value = r.headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    if is_digits(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _reason(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:300]
    return str(body.get("reason") or body.get("detail") or body)[:300] if isinstance(body, dict) else str(body)[:300]


class ApiClient:
    batch_path = "/v1/svids/x509/batch"

    def __init__(self, server: str, identity: NodeIdentity, *, timeout: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.identity = identity
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._generation = -1
        self._closed = False

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._closed:
                raise Unreachable("the agent is stopping")
            if self._client is None or self._generation != self.identity.generation:
                old = self._client
                self._generation = self.identity.generation
                self._client = httpx.Client(base_url=self.server, verify=self.identity.ssl_context(),
                                            timeout=self.timeout,
                                            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))
                if old is not None:
                    old.close()
            return self._client

    def close(self) -> None:
        """Close the pool, which also ends requests in flight (a held long-poll) on other threads."""
        with self._lock:
            self._closed = True
            if self._client is not None:
                self._client.close()
                self._client = None

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201), timeout: float | None = None,
                **kw: Any) -> httpx.Response:
        try:
            r = self._http().request(method, path, timeout=timeout or self.timeout, **kw)
        except (httpx.TransportError, OSError) as exc:
            raise Unreachable(f"{self.server}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code not in ok:
            raise Refused(r.status_code, _reason(r), retry_after(r))
        return r

    # ------------------------------------------------------------------ identity
    def attest(self, token: str) -> None:
        """Exchange a join token for the node SVID (no client certificate: the token is the credential)."""
        key, csr = new_key_and_csr(f"node {self.identity.node}")
        try:
            with httpx.Client(base_url=self.server, verify=self.identity.ssl_context(client_cert=False),
                              timeout=self.timeout) as c:
                r = c.post("/v1/nodes/attest", json={"token": token, "csr": csr, "node_name": self.identity.node})
        except (httpx.TransportError, OSError) as exc:
            raise Unreachable(f"{self.server}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 201:
            raise Refused(r.status_code, f"attestation refused: {_reason(r)}")
        self.identity.store_svid(key, r.json())

    def renew(self) -> None:
        key, csr = new_key_and_csr(f"node {self.identity.node}")
        r = self.request("POST", "/v1/nodes/renew", json={"csr": csr})
        self.identity.store_svid(key, r.json())

    def refresh_bundle(self) -> bool:
        return self.identity.store_bundle(self.request("GET", "/v1/bundle").json())

    # ------------------------------------------------------------------ devices
    def ruleset(self, device: str, etag: str | None, wait: int) -> dict[str, Any] | None:
        """The desired rule set, or None when `etag` is still current (304)."""
        headers = {"If-None-Match": f'"{etag}"'} if etag else {}
        r = self.request("GET", f"/v1/devices/{device}/ruleset", ok=(200, 304), params={"wait": wait} if etag else {},
                         headers=headers, timeout=self.timeout + wait)
        if r.status_code == 304:
            return None
        doc = dict(r.json())
        doc[VIEW_KEY] = r.headers.get("X-Fabric-View")  # a leaf's fabric view hash (None: a NIC, or not sent)
        return doc

    def leaf_view(self, device: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/devices/{device}/fabric").json())

    def report(self, device: str, status: dict[str, Any]) -> dict[str, Any]:
        """The device's row as the server holds it after the report (`stale`: the report changed nothing)."""
        return dict(self.request("POST", f"/v1/devices/{device}/status", json=status).json())

    # ------------------------------------------------------------------ workloads
    def placements(self, timeout: float | None = None) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/v1/nodes/{self.identity.node}/placements", timeout=timeout).json())

    def revoked_serials(self, timeout: float | None = None) -> set[int]:
        """The serials on the CRLs of every CA generation (fetched over the verified connection)."""
        pem = self.request("GET", "/v1/crl", params={"format": "pem"}, timeout=timeout).content
        marker = b"-----BEGIN X509 CRL-----"
        out: set[int] = set()
        for part in pem.split(marker)[1:]:
            try:
                crl = x509.load_pem_x509_crl(marker + part)
            except ValueError as exc:
                raise Refused(200, f"the CRL does not parse: {exc}") from None
            out |= {r.serial_number for r in crl}
        return out

    def x509_svid(self, workload: str, csr: str) -> dict[str, Any]:
        t, g, w = workload.split("/")
        return dict(self.request("POST", "/v1/svids/x509", json={"csr": csr, "tenant": t, "group": g,
                                                                  "workload": w}).json())

    def x509_svids(self, asks: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """POST /v1/svids/x509/batch for (workload "tenant/group/name", CSR) pairs: one result per pair, in order,
        each {"svid": {...}} or {"error": {"status", "reason"}}. Refused for the request as a whole (a server
        without the route: 404 or 405), Unreachable as any request."""
        svids = []
        for workload, csr in asks:
            t, g, w = workload.split("/")
            svids.append({"csr": csr, "tenant": t, "group": g, "workload": w})
        results = self.request("POST", self.batch_path, json={"svids": svids}).json().get("results")
        if not isinstance(results, list) or len(results) != len(asks):
            raise Refused(200, f"the batch answer has {len(results) if isinstance(results, list) else 'no'} "
                               f"results for {len(asks)} entries")
        return [dict(r) for r in results]

    def jwt_svid(self, workload: str, audience: list[str]) -> dict[str, Any]:
        t, g, w = workload.split("/")
        return dict(self.request("POST", "/v1/svids/jwt", json={"tenant": t, "group": g, "workload": w,
                                                                 "audience": audience}).json())
