"""Workload identities held by the agent for the workloads placed on its node (as a SPIRE agent caches the
entries parented to it).

- Placements (workload, SPIFFE ID, selectors) come from `GET /v1/nodes/<node>/placements`, refreshed every
  `refresh_every` seconds.
- X.509-SVIDs: the key is generated here and never leaves the node; the server signs a CSR over the node's
  mTLS (it issues only for workloads placed on this node). Fetched when a workload first asks, renewed at
  half life (or when the trust bundle changes), dropped when the workload leaves the node or the server
  refuses it (revoked, quarantined). Every change bumps `version` and wakes the Workload API's streams.
- JWT-SVIDs: per (workload, audience), kept until half life.
Nothing is written to disk: a restarted agent fetches again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.api import ApiClient, Refused, Unreachable
from agent.identity import key_pem, new_key_and_csr
from agent.metrics import AgentMetrics

log = logging.getLogger("trustfabric.agent.svids")


@dataclass(frozen=True)
class Placement:
    workload: str
    spiffe_id: str
    selectors: tuple[str, ...]


@dataclass(frozen=True)
class X509Entry:
    spiffe_id: str
    chain_der: bytes  # leaf first, then intermediates
    key_der: bytes  # PKCS#8
    not_before: float
    not_after: float

    def renew_at(self) -> float:
        return self.not_before + (self.not_after - self.not_before) / 2


@dataclass(frozen=True)
class JwtEntry:
    token: str
    spiffe_id: str
    issued: float
    expires: float


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()


class WorkloadSvids:
    def __init__(self, api: ApiClient, metrics: AgentMetrics, *, refresh_every: float = 5.0,
                 clock: Any = time.time) -> None:
        self.api = api
        self.metrics = metrics
        self.refresh_every = refresh_every
        self.clock = clock
        self.changed = threading.Condition()
        self.version = 0
        self.placements: dict[str, Placement] = {}
        self._x509: dict[str, X509Entry] = {}
        self._jwt: dict[tuple[str, tuple[str, ...]], JwtEntry] = {}
        self._lock = threading.RLock()
        self._placements_at = 0.0

    def _bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def wait_change(self, seen: int, timeout: float) -> int:
        with self.changed:
            if self.version == seen:
                self.changed.wait(timeout)
            return self.version

    # ------------------------------------------------------------------ placements
    def refresh_placements(self, force: bool = False) -> None:
        with self._lock:
            if not force and self.clock() - self._placements_at < self.refresh_every:
                return
            rows = self.api.placements()
            self._placements_at = self.clock()
            new = {r["workload"]: Placement(r["workload"], r["spiffe_id"], tuple(r.get("selectors") or ()))
                   for r in rows}
            if new == self.placements:
                return
            gone = set(self.placements) - set(new)
            self.placements = new
            for w in gone:
                self._x509.pop(w, None)
            self._jwt = {k: v for k, v in self._jwt.items() if k[0] in new}
        self._bump()

    def for_caller(self, matches: Any) -> list[Placement]:
        """The placements whose selectors the caller matches (`matches(selectors) -> bool`)."""
        try:
            self.refresh_placements()
        except (Unreachable, Refused) as exc:  # keep serving what is known
            log.warning("placements not refreshed: %s", exc)
        with self._lock:
            return [p for p in sorted(self.placements.values(), key=lambda p: p.workload) if matches(p.selectors)]

    # ------------------------------------------------------------------ X.509
    def x509(self, workload: str) -> X509Entry | None:
        """The workload's current X.509-SVID, fetched or renewed when due; None when the server refuses it."""
        with self._lock:
            entry = self._x509.get(workload)
            if entry is not None and self.clock() < entry.renew_at():
                return entry
            try:
                fresh = self._issue_x509(workload)
            except Refused as exc:
                log.warning("%s: no X.509-SVID: %s", workload, exc)
                if self._x509.pop(workload, None) is not None:
                    self._bump()
                return None
            except Unreachable as exc:  # keep serving the one we have while it is valid
                log.warning("%s: X.509-SVID not renewed (server unreachable): %s", workload, exc)
                return entry if entry is not None and self.clock() < entry.not_after else None
            self._x509[workload] = fresh
        self.metrics.svid_expiry.labels(fresh.spiffe_id).set(fresh.not_after)
        self._bump()
        return fresh

    def _issue_x509(self, workload: str) -> X509Entry:
        key, csr = new_key_and_csr(workload)
        issued = self.api.x509_svid(workload, csr)
        certs = [x509.load_pem_x509_certificate(str(p).encode())
                 for p in [issued["certificate"], *(issued.get("chain") or [])]]
        chain = b"".join(c.public_bytes(serialization.Encoding.DER) for c in certs)
        key_der = serialization.load_pem_private_key(key_pem(key), None).private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return X509Entry(str(issued["spiffe_id"]), chain, key_der, certs[0].not_valid_before_utc.timestamp(),
                         certs[0].not_valid_after_utc.timestamp())

    def renew_due(self) -> None:
        """Renew every cached X.509-SVID past half life (the streams then send the new one)."""
        with self._lock:
            due = [w for w, e in self._x509.items() if self.clock() >= e.renew_at()]
        for w in due:
            self.x509(w)

    def rotate_all(self) -> None:
        """Renew every cached X.509-SVID now (the trust bundle changed: a new CA generation signs)."""
        with self._lock:
            self._x509 = {w: X509Entry(e.spiffe_id, e.chain_der, e.key_der, e.not_before, e.not_before)
                          for w, e in self._x509.items()}
        self.renew_due()

    # ------------------------------------------------------------------ JWT
    def jwt(self, workload: str, audience: list[str]) -> JwtEntry | None:
        key = (workload, tuple(sorted(audience)))
        with self._lock:
            entry = self._jwt.get(key)
            now = self.clock()
            if entry is not None and now < entry.issued + (entry.expires - entry.issued) / 2:
                return entry
            try:
                issued = self.api.jwt_svid(workload, sorted(audience))
            except Refused as exc:
                log.warning("%s: no JWT-SVID: %s", workload, exc)
                self._jwt.pop(key, None)
                return None
            fresh = JwtEntry(str(issued["token"]), str(issued["spiffe_id"]), now, _ts(str(issued["expires_at"])))
            self._jwt[key] = fresh
            return fresh
