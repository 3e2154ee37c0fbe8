"""Workload identities held by the agent for the workloads placed on its node (as a SPIRE agent caches the
entries parented to it).

- Placements (workload, SPIFFE ID, selectors) come from `GET /v1/nodes/<node>/placements`, refreshed every
  `refresh_every` seconds.
- X.509-SVIDs: the key is generated here and never leaves the node; the server signs a CSR over the node's
  mTLS (it issues only for workloads placed on this node). Fetched when a workload first asks, renewed at
  half life (or when the trust bundle changes), dropped when the workload leaves the node or the server
  refuses it (revoked, quarantined). Every change bumps `version` and wakes the Workload API's streams.
  Renewals (at half life, and all at once after a CA rotation) go in batches of up to BATCH per request
  (POST /v1/svids/x509/batch, SPIRE's BatchNewX509SVID), each entry answered and handled on its own; a server
  without that route (404/405: an older one during an upgrade) gets one request per workload from then on.
- JWT-SVIDs: per (workload, audience), kept until half life, in memory only.

Across a restart (as a SPIRE agent keeps its SVID cache): the placements and X.509-SVIDs (keys included)
are kept in `svids.sealed` in the data directory, AES-256-GCM under the agent's key file (agent/at_rest.py).
A restarted agent serves them only once it re-synced with the server: the placements read again (a workload
moved away or unplaced while the agent was down is dropped, never served) and the CRL read (an SVID revoked
meanwhile is dropped). That costs two small GETs, not one CSR and signature per workload, so the Workload
API answers from the cache within those requests' bound (`resync_timeout`); until the server answered it
answers UNAVAILABLE (the Workload API's "not ready, retry"), never from an unconfirmed cache. Once synced, a
server that stops answering changes nothing: what was confirmed is served while it is valid (fail static).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent.api import ApiClient, Refused, Unreachable
from agent.at_rest import AtRest, AtRestError
from agent.identity import AgentError, key_der, new_key_and_csr
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

    def serial(self) -> int:
        """The leaf's serial (the leaf is the chain's first DER SEQUENCE: its length from its header)."""
        d = self.chain_der
        n = d[1] & 0x7F if d[1] & 0x80 else 0
        size = 2 + n + (int.from_bytes(d[2:2 + n], "big") if n else d[1])
        return x509.load_der_x509_certificate(d[:size]).serial_number


@dataclass(frozen=True)
class JwtEntry:
    token: str
    spiffe_id: str
    issued: float
    expires: float


class NotSynced(AgentError):
    """The agent restarted and has not yet confirmed its cached identities with the server."""


CACHE_FILE = "svids.sealed"
CACHE_PURPOSE = "svid-cache"


class SvidCache:
    """The placements and X.509-SVIDs of a node, sealed in one file (written whole: tmp + rename)."""

    def __init__(self, path: Path, at_rest: AtRest) -> None:
        self.path = Path(path)
        self.at_rest = at_rest

    def save(self, placements: dict[str, Placement], x509s: dict[str, X509Entry]) -> None:
        from core.files import write_private_file

        doc = {"node": self.at_rest.node,
               "placements": [asdict(p) for p in sorted(placements.values(), key=lambda p: p.workload)],
               "x509": {w: {**asdict(e), "chain_der": base64.b64encode(e.chain_der).decode(),
                            "key_der": base64.b64encode(e.key_der).decode()} for w, e in sorted(x509s.items())}}
        plain = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        write_private_file(self.path, self.at_rest.seal(plain, CACHE_PURPOSE), overwrite=True)

    def load(self, now: float) -> tuple[dict[str, Placement], dict[str, X509Entry]]:
        """What the last run kept (expired SVIDs left out); nothing when there is no file or it does not open
        (the cache only saves work: a bad one is logged and ignored, never fatal)."""
        try:
            doc = json.loads(self.at_rest.unseal(self.path.read_bytes(), CACHE_PURPOSE))
            if doc.get("node") != self.at_rest.node:
                raise ValueError(f"the cache is node {doc.get('node')!r}'s")
            placements = {p["workload"]: Placement(str(p["workload"]), str(p["spiffe_id"]),
                                                   tuple(str(x) for x in p["selectors"])) for p in doc["placements"]}
            x509s = {str(w): X509Entry(str(e["spiffe_id"]), base64.b64decode(e["chain_der"]),
                                       base64.b64decode(e["key_der"]), float(e["not_before"]), float(e["not_after"]))
                     for w, e in doc["x509"].items()}
        except FileNotFoundError:
            return {}, {}
        except (OSError, AtRestError, ValueError, KeyError, TypeError) as exc:
            log.warning("the workload SVID cache %s is ignored: %s", self.path, exc)
            return {}, {}
        return placements, {w: e for w, e in x509s.items() if now < e.not_after and w in placements}


BATCH = 100  # entries per POST /v1/svids/x509/batch: the server's bound


def _entry(issued: dict[str, Any], key: bytes) -> X509Entry:
    """The cache entry for an X509SvidOut answer and the key its CSR was made with."""
    certs = [x509.load_pem_x509_certificate(str(p).encode())
             for p in [issued["certificate"], *(issued.get("chain") or [])]]
    chain = b"".join(c.public_bytes(serialization.Encoding.DER) for c in certs)
    return X509Entry(str(issued["spiffe_id"]), chain, key, certs[0].not_valid_before_utc.timestamp(),
                     certs[0].not_valid_after_utc.timestamp())


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()


class WorkloadSvids:
    def __init__(self, api: ApiClient, metrics: AgentMetrics, *, refresh_every: float = 5.0,
                 clock: Any = time.time, cache: SvidCache | None = None, resync_timeout: float = 3.0) -> None:
        self.api = api
        self.metrics = metrics
        self.refresh_every = refresh_every
        self.clock = clock
        self.cache = cache
        self.resync_timeout = resync_timeout
        self.changed = threading.Condition()
        self.version = 0
        self.placements: dict[str, Placement] = {}
        self._x509: dict[str, X509Entry] = {}
        self._jwt: dict[tuple[str, tuple[str, ...]], JwtEntry] = {}
        self._lock = threading.RLock()
        self._placements_at = 0.0
        self.synced = False  # placements (and the CRL, for cached SVIDs) confirmed by the server since start
        self.from_cache = 0  # SVIDs the last run left, kept until the re-sync judged them
        self.batches = True  # renewals in batches (POST /v1/svids/x509/batch) until the server shows it has none
        if cache is not None:
            self.placements, self._x509 = cache.load(clock())
            self.from_cache = len(self._x509)

    def _bump(self) -> None:
        if self.cache is not None:
            with self._lock:
                placements, x509s = dict(self.placements), dict(self._x509)
            try:
                self.cache.save(placements, x509s)
            except OSError as exc:  # the cache only saves work; serving goes on
                log.warning("the workload SVID cache not written: %s", exc)
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
        """Read the node's placements (every `refresh_every` s, or now with `force` or before the first sync);
        the first time after a start also the CRL, when SVIDs came from the cache."""
        with self._lock:
            if self.synced and not force and self.clock() - self._placements_at < self.refresh_every:
                return
            timeout = None if self.synced else self.resync_timeout
            rows = self.api.placements(timeout=timeout)
            revoked = self.api.revoked_serials(timeout=timeout) if not self.synced and self._x509 else set()
            self._placements_at = self.clock()
            new = {r["workload"]: Placement(r["workload"], r["spiffe_id"], tuple(r.get("selectors") or ()))
                   for r in rows}
            dropped = [w for w, e in self._x509.items()
                       if w not in new or new[w].spiffe_id != e.spiffe_id or e.serial() in revoked]
            first, self.synced = not self.synced, True
            if new == self.placements and not dropped:
                if first and self.from_cache:
                    log.info("re-synced: %d cached workload SVIDs confirmed", self.from_cache)
                return
            for w in dropped:
                self._x509.pop(w, None)
            if first and self.from_cache:
                log.info("re-synced: %d cached workload SVIDs confirmed, %d dropped (unplaced, moved or revoked)",
                         self.from_cache - len(dropped), len(dropped))
            self.placements = new
            self._jwt = {k: v for k, v in self._jwt.items() if k[0] in new}
        self._bump()

    def for_caller(self, matches: Any) -> list[Placement]:
        """The placements whose selectors the caller matches (`matches(selectors) -> bool`); NotSynced while a
        restarted agent has not heard from the server (its cache is not served unconfirmed)."""
        try:
            self.refresh_placements()
        except (Unreachable, Refused) as exc:  # once synced: keep serving what is known
            if not self.synced:
                raise NotSynced(f"re-syncing with the server: {exc}") from None
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
        return _entry(self.api.x509_svid(workload, csr), key_der(key))

    def renew_due(self) -> None:
        """Renew every cached X.509-SVID past half life (the streams then send the new one): in batches of up to
        BATCH (POST /v1/svids/x509/batch, one request each), one request each on a server without that route."""
        with self._lock:
            due = [w for w, e in self._x509.items() if self.clock() >= e.renew_at()]
        if not self.batches:
            for w in due:
                self.x509(w)
            return
        for start in range(0, len(due), BATCH):
            chunk = due[start:start + BATCH]
            if not self._renew_batch(chunk):  # an older server (during an upgrade): one request each from now on
                log.info("the server has no batch SVID route; renewing one request per workload")
                self.batches = False
                for w in due[start:]:
                    self.x509(w)
                return

    def _renew_batch(self, workloads: list[str]) -> bool:
        """Renew `workloads` in one request, each handled as `x509` handles its renewal: refused, it is dropped
        (with the request, when the request as a whole is refused); unreachable, the one held is kept while valid.
        False (nothing changed) when the server has no batch route."""
        with self._lock:
            due = [w for w in workloads
                   if w in self._x509 and self.clock() >= self._x509[w].renew_at()]  # (not renewed meanwhile)
            if not due:
                return True
            keys = {w: new_key_and_csr(w) for w in due}
            try:
                results: list[dict[str, Any]] = self.api.x509_svids([(w, keys[w][1]) for w in due])
            except Refused as exc:
                if exc.status in (404, 405):
                    return False
                results = [{"error": {"status": exc.status, "reason": str(exc)}}] * len(due)
            except Unreachable as exc:  # keep serving the ones we have while they are valid (x509 serves them so)
                log.warning("%d X.509-SVIDs not renewed (server unreachable): %s", len(due), exc)
                return True
            fresh: list[X509Entry] = []
            dropped = 0
            for w, result in zip(due, results, strict=True):
                error = result.get("error")
                svid = result.get("svid")
                if error or not isinstance(svid, dict):
                    reason = f"{error.get('status')}: {error.get('reason')}" if isinstance(error, dict) else str(result)
                    log.warning("%s: no X.509-SVID: %s", w, reason)
                    dropped += self._x509.pop(w, None) is not None
                    continue
                try:
                    entry = _entry(svid, key_der(keys[w][0]))
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("%s: no X.509-SVID: the server's answer does not parse: %s", w, exc)
                    dropped += self._x509.pop(w, None) is not None
                    continue
                self._x509[w] = entry
                fresh.append(entry)
        for entry in fresh:
            self.metrics.svid_expiry.labels(entry.spiffe_id).set(entry.not_after)
        if fresh or dropped:
            self._bump()
        return True

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
