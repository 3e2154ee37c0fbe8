"""Workload identities held by the agent for the workloads placed on its node (as a SPIRE agent caches the
entries parented to it).

- Placements (workload, SPIFFE ID, selectors) come from `GET /v1/nodes/<node>/placements`, refreshed every
  `refresh_every` seconds.
- X.509-SVIDs: the key is generated here and never leaves the node; the server signs a CSR over the node's
  mTLS (it issues only for workloads placed on this node). Fetched when a workload first asks, renewed at
  half life (or when the trust bundle changes), dropped when the workload leaves the node or the server
  refuses it for good (below). Every change bumps `version` and wakes the Workload API's streams.
  Renewals (at half life, and all at once after a CA rotation) go in batches of up to BATCH per request
  (POST /v1/svids/x509/batch, SPIRE's BatchNewX509SVID), each entry answered and handled on its own; a server
  without that route (404/405: an older one during an upgrade) gets one request per workload from then on; a
  batch the server refuses whole as too large for it (413, or 422: above the rate limit's burst, which the server
  charges one token per entry) is sent again in halves, and the smaller size kept.
- A renewal's answer (one request's, or one batch entry's) decides the held SVID:
  * definitive, the held SVID is dropped at once: 403 (the identity revoked, the group quarantined, the workload
    not placed on this node or out of its scope), 404 (no such workload), 401 (the server no longer accepts this
    node's own SVID: the node revoked, or its SVID not issued by this server; the node must attest again, and a
    node the control plane refuses does not go on handing out identities);
  * anything else is transient, and the held SVID is served while it is valid: 429 (rate limited), 5xx and no
    answer (the server down, draining, its database restarting), 409 (no CA that can sign: an expired one, or one
    rotated out meanwhile; an operator's `ca rotate` mends it, and the workload is not at fault) and 400 (the
    server refused the CSR the agent made: an agent and a server that disagree, which no workload caused; logged
    as an error), and an answer the agent cannot use (it does not parse, its certificate does not certify the key of
    the CSR sent or names another workload: never held, nor served to anyone; a batch entry so is dropped instead,
    as before). The workload is asked for again no sooner than the answer's Retry-After (with up to 10% more,
    so a fleet of agents does not come back at the same instant), or else after a backoff that doubles from
    BACKOFF_MIN to BACKOFF_MAX seconds with jitter; never in a loop (a batch refused whole so holds back the other
    batches of its round as long: the server would refuse them too). A workload that holds no valid SVID
    meanwhile is answered UNAVAILABLE by the Workload API (`RetryLater`: the SPIFFE Workload API's "retry"),
    never PERMISSION_DENIED, which says the caller has no identity to get.
- JWT-SVIDs: per (workload, audience), fetched again at half life, in memory only, by the same rules: a definitive
  refusal (of a JWT-SVID for any audience, or of the workload's X.509-SVID: it is about the workload, never an
  audience) drops every JWT-SVID held for the workload; a transient one (or no answer) keeps it served while it is
  valid, and with none valid held the Workload API answers UNAVAILABLE (`RetryLater`). Asked when a workload asks, and
  the workload picks the audience, so the agent bounds what its workloads make it ask the server: JWT_PER_WORKLOAD
  fetches a second per workload, JWT_PER_NODE for the node (the server's rate limit is the node's, shared with its
  X.509 renewals and placements: a workload asking new audiences in a loop must not get the node 429s, which would keep
  a revoked workload's X.509-SVID served, its renewal never answered 403), and JWT_AUDIENCES cached per workload. The
  node's bound is shared fairly (core.ratelimit.FairBucket): while others ask, no workload takes more than its share
  (the node's rate and burst, less JWT_NODE_RESERVE, divided among the workloads that asked in the last
  JWT_BUSY_WINDOW seconds), and the last JWT_NODE_RESERVE fetches of the node's burst go only to a workload that had
  not asked within that window: busy workloads cannot make a quiet one's first fetch UNAVAILABLE, and the node's
  fetches together never exceed JWT_PER_NODE. Over a bound, the workload gets its held JWT-SVID while valid, else
  UNAVAILABLE. An answer whose token is not the workload's (`sub`) for the audience asked (`aud`), or does not parse,
  is never held: as a 5xx.
- A slow or unreachable server delays only the asks that need its answer: no request is made under the agent's lock,
  one request at a time per workload's X.509-SVID (a batch renewal counts for each of its workloads), per workload
  and audience's JWT-SVID and for the placements, the others asking meanwhile sharing its outcome (waited for up to
  the request's own timeout, and a margin); a request that failed is not sent again at once by the next ask (an
  SVID's after its retry wait, above; the placements' after a floor, below). A Workload API caller never waits for
  the server about an SVID it holds valid: it gets the held one, a renewal due and the placements' refresh going on
  behind it. An answer arriving after its workload was dropped (refused for good, unplaced, moved, revoked) is
  discarded, never served.

Across a restart (as a SPIRE agent keeps its SVID cache): the placements and X.509-SVIDs (keys included)
are kept in `svids.sealed` in the data directory, AES-256-GCM under the agent's key file (agent/at_rest.py).
A restarted agent serves them only once it re-synced with the server: the placements read again (a workload
moved away or unplaced while the agent was down is dropped, never served) and the CRL read (an SVID revoked
meanwhile is dropped). That costs two small GETs, not one CSR and signature per workload, so the Workload
API answers from the cache within those requests' bound (`resync_timeout`); until the server answered it
answers UNAVAILABLE (the Workload API's "not ready, retry"), never from an unconfirmed cache. A read that failed
(429, 5xx, no answer) is not sent again before a floor: the server's Retry-After, or else a backoff from
PLACEMENTS_BACKOFF_MIN (0.25 s) doubling per failure in a row, with jitter; either at most PLACEMENTS_WAIT_MAX (5 s,
and up to 10% more, so a fleet does not come back at once). Callers meanwhile are answered UNAVAILABLE at once
(or wait for a read in flight), without a request: a fleet of restarted agents asks a recovering server once per
floor each, not once per Workload API call, and re-syncs at most that floor (5.5 s) after the server is back, at
the first ask then (the same floor spaces a synced agent's refreshes after a failure). Once synced, a server that
stops answering changes nothing: what was confirmed is served while it is valid (fail static).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Collection
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import jwt as pyjwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.api import ApiClient, Refused, Unreachable
from agent.at_rest import AtRest, AtRestError
from agent.identity import AgentError, key_der, new_key_and_csr
from agent.metrics import AgentMetrics
from core.ratelimit import FairBucket, TokenBucket
from pki.errors import InvalidSpiffeId
from pki.spiffe_id import parse_spiffe_id

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
    forced: bool = False  # due for renewal now, whatever its age (a new CA generation signs: rotate_all)

    def renew_at(self) -> float:
        return self.not_before if self.forced else self.not_before + (self.not_after - self.not_before) / 2

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


class RetryLater(AgentError):
    """The workload holds no valid X.509-SVID, and the server could not issue one just now (a transient answer, or
    none): the Workload API answers UNAVAILABLE, the SPIFFE Workload API's "retry"."""


DEFINITIVE = frozenset({401, 403, 404})  # the answers that drop a held SVID (the module docstring says why)
JWT_PER_WORKLOAD = (1.0, 8)  # JWT-SVID fetches from the server a workload may cause: rate a second, burst
JWT_PER_NODE = (10.0, 20)  # and all the node's workloads together (the server's default per principal: 50/s, 100)
JWT_NODE_RESERVE = 4  # of JWT_PER_NODE's burst, kept for workloads that did not ask in the last JWT_BUSY_WINDOW s
JWT_BUSY_WINDOW = 2.0  # seconds: a workload that asked within them is busy, and counts in the node's shares
JWT_AUDIENCES = 32  # JWT-SVIDs kept per workload (the oldest fetched goes first)
BACKOFF_MIN = 1.0  # seconds before the first retry of a renewal that failed without a Retry-After
BACKOFF_MAX = 60.0  # the backoff's bound (it doubles per failure in a row, with jitter)
RETRY_AFTER_MAX = 600.0  # a server's Retry-After is honoured up to this; a larger one is taken as this


PLACEMENTS_BACKOFF_MIN = 0.25  # seconds before a failed placements read is sent again (no Retry-After): it doubles
PLACEMENTS_WAIT_MAX = 5.0  # up to this, a Retry-After too: a restarted agent serves nothing until it re-synced


def retry_wait(failures: int, retry_after: float | None, jitter: random.Random, *, least: float = BACKOFF_MIN,
               most: float = BACKOFF_MAX, after_most: float = RETRY_AFTER_MAX) -> float:
    """Seconds before asking again after a transient failure (the `failures`-th in a row, from 0): the server's
    Retry-After (at least `least`, at most `after_most`, and up to 10% more, so that agents told the same do not come
    back at once), or else a backoff doubling from `least` to `most` with jitter. One rule for the workload SVIDs'
    renewals, the node SVID's and the placements' reads (with their own bounds)."""
    if retry_after is not None:
        return min(max(retry_after, least), after_most) * jitter.uniform(1.0, 1.1)
    return float(min(most, least * 2.0 ** min(failures, 16)) * jitter.uniform(0.5, 1.0))


def definitive(status: int) -> bool:
    return status in DEFINITIVE


def _too_large(status: int) -> bool:
    """A batch refused whole for its size (413: the body; 422: more entries than the server takes, its rate limit's
    burst included): the same workloads in smaller batches may pass."""
    return status in (413, 422)


CACHE_FILE = "svids.sealed"
CACHE_PURPOSE = "svid-cache"


def _placements_of(rows: list[dict[str, Any]]) -> dict[str, Placement]:
    """The placements an answer of GET /v1/nodes/<node>/placements lists; KeyError, TypeError, ValueError or
    AttributeError when it is not such an answer (read before anything is changed)."""
    if not isinstance(rows, list):
        raise TypeError(f"a list of placements expected, not {type(rows).__name__}")
    return {str(r["workload"]): Placement(str(r["workload"]), str(r["spiffe_id"]),
                                          tuple(str(x) for x in r.get("selectors") or ()))
            for r in rows}

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
                                       base64.b64decode(e["key_der"]), float(e["not_before"]), float(e["not_after"]),
                                       bool(e.get("forced", False)))
                     for w, e in doc["x509"].items()}
        except FileNotFoundError:
            return {}, {}
        except (OSError, AtRestError, ValueError, KeyError, TypeError) as exc:
            log.warning("the workload SVID cache %s is ignored: %s", self.path, exc)
            return {}, {}
        return placements, {w: e for w, e in x509s.items() if now < e.not_after and w in placements}


BATCH = 100  # entries per POST /v1/svids/x509/batch: the server's bound (and its default rate-limit burst)
_DONE, _NO_ROUTE, _HELD = 0, -1, -2  # _renew_batch's outcomes (a positive one: the smaller batch size to send instead)


def _entry(issued: dict[str, Any], key: ec.EllipticCurvePrivateKey, workload: str) -> X509Entry:
    """The cache entry for an X509SvidOut answer to `workload`'s CSR, made with `key`. ValueError unless the leaf
    certifies that key and names that workload (a batch answer out of order, a proxy's or server's mix-up): a
    workload is never handed another's SVID, nor a certificate that is not its key's."""
    certs = [x509.load_pem_x509_certificate(str(p).encode())
             for p in [issued["certificate"], *(issued.get("chain") or [])]]
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if certs[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise ValueError("the certificate is not for the key of the CSR sent")
    try:
        sans = certs[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sid = parse_spiffe_id(sans.get_values_for_type(x509.UniformResourceIdentifier)[0])
    except (x509.ExtensionNotFound, IndexError, InvalidSpiffeId) as exc:
        raise ValueError(f"the certificate carries no SPIFFE ID ({exc})") from None
    tenant, group, name = workload.split("/")
    if sid.segments != ("tenant", tenant, "group", group, name) or str(issued["spiffe_id"]) != str(sid):
        raise ValueError(f"the certificate is {sid}'s, not {workload}'s")
    chain = b"".join(c.public_bytes(serialization.Encoding.DER) for c in certs)
    return X509Entry(str(sid), chain, key_der(key), certs[0].not_valid_before_utc.timestamp(),
                     certs[0].not_valid_after_utc.timestamp())


def _jwt_entry(issued: dict[str, Any], workload: str, audience: tuple[str, ...], now: float) -> JwtEntry:
    """The JWT-SVID of a JwtSvidOut answer to `workload`'s fetch for `audience`. ValueError unless the token is that
    workload's (its `sub` the answer's SPIFFE ID, naming the workload) for that audience: a workload is never handed
    another's JWT-SVID. (Its signature is the validator's to check against the bundle; this is about whose it is.)"""
    token, sid = str(issued["token"]), parse_spiffe_id(str(issued["spiffe_id"]))
    claims = pyjwt.decode(token, options={"verify_signature": False})
    aud = claims.get("aud")
    tenant, group, name = workload.split("/")
    if sid.segments != ("tenant", tenant, "group", group, name) or claims.get("sub") != str(sid):
        raise ValueError(f"the JWT-SVID is {claims.get('sub')}'s, not {workload}'s")
    if sorted([aud] if isinstance(aud, str) else aud or []) != sorted(audience):
        raise ValueError(f"the JWT-SVID is for audience {aud}, not {list(audience)}")
    return JwtEntry(token, str(sid), now, _ts(str(issued["expires_at"])))


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC).timestamp()


T = TypeVar("T")
K = TypeVar("K")
FLIGHT_MARGIN = 2.0  # seconds a caller waits for another's request to the server beyond that request's own timeout


class _Flight(Generic[T]):
    """One request to the server in flight for a key (a workload's X.509-SVID, its JWT-SVID for one audience, the
    node's placements): whoever asks for the same meanwhile waits for this outcome (bounded) instead of sending one
    more request, which a slow server would answer as late. Its fields are set before `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None  # what it brought, once applied
        self.dropped = False  # refused for good, or the workload dropped while it was in flight: nothing to serve
        self.failed: str | None = None  # a transient failure's reason (the retry wait is set): the held one, if valid
        self.error: Unreachable | Refused | None = None  # (placements) why the read failed

    def wait(self, deadline: float) -> bool:
        """True once it landed; False when `deadline` (time.monotonic) passed first."""
        return self.done.wait(max(0.0, deadline - time.monotonic()))


class WorkloadSvids:
    """The placements and SVIDs of the node's workloads. Concurrency: `_lock` guards the in-memory state only and is
    never held across a request to the server (one slow request must not keep every Workload API caller waiting, the
    held SVIDs' fast path included). A request is sent by one thread at a time per key (a `_Flight`); its answer is
    applied under the lock after re-checking the state it was asked in: a workload dropped meanwhile (`_drops`:
    refused for good, unplaced, moved, revoked) is not resurrected by a late answer, and a CA rotation meanwhile
    (`_rotations`) leaves the answer due for renewal (it may be the old CA's)."""

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
        self._jwt_asks = TokenBucket(*JWT_PER_WORKLOAD)  # per workload
        self._jwt_node = FairBucket(*JWT_PER_NODE, reserve=JWT_NODE_RESERVE, window=JWT_BUSY_WINDOW)  # shared fairly
        self._jwt_retry_at: dict[str, float] = {}  # workload -> no JWT-SVID asked before then (the server failed)
        self._jwt_failures: dict[str, int] = {}  # workload -> such failures in a row (the backoff's exponent)
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()  # one cache write at a time, each of the state as it is then
        self._placements_at = 0.0
        self._placements_retry_at = 0.0  # time.monotonic(): no placements read (but a forced one) before then
        self._placements_failures = 0  # reads failed in a row (the floor's exponent)
        self._placements_why = ""  # why the last one failed
        self.synced = False  # placements (and the CRL, for cached SVIDs) confirmed by the server since start
        self.from_cache = 0  # SVIDs the last run left, kept until the re-sync judged them
        self.batches = True  # renewals in batches (POST /v1/svids/x509/batch) until the server shows it has none
        self.batch_limit: int | None = None  # a smaller batch than BATCH, once the server refused one as too large
        self._retry_at: dict[str, float] = {}  # workload -> no renewal asked before then (a transient failure)
        self._failures: dict[str, int] = {}  # workload -> transient failures in a row (the backoff's exponent)
        self._jitter = random.Random()  # spreads retries (no secret)
        self._x509_flights: dict[str, _Flight[X509Entry]] = {}  # workload -> its issue or renewal in flight
        self._jwt_flights: dict[tuple[str, tuple[str, ...]], _Flight[JwtEntry]] = {}
        self._placements_flight: _Flight[None] | None = None
        self._refreshing = False  # a refresh started behind a Workload API caller is under way
        self._behind: set[str] = set()  # workloads a renew_behind thread is started for and not done with
        self._drops: dict[str, int] = {}  # workload -> times its X.509-SVID was dropped (older answers are stale)
        self._jwt_drops: dict[str, int] = {}  # workload -> times its JWT-SVIDs were dropped
        self._rotations = 0  # rotate_all calls (an answer asked before the last one may be the old CA's)
        self._closed = False  # the agent stopped: nothing started behind a caller, nothing written
        if cache is not None:
            self.placements, self._x509 = cache.load(clock())
            self.from_cache = len(self._x509)

    @property
    def _flight_wait(self) -> float:
        """How long an ask waits for another's request to the same end: that request's own bound, and a margin."""
        return float(self.api.timeout) + FLIGHT_MARGIN

    def close(self) -> None:
        """The agent is stopping: no refresh or renewal is started any more, and an answer still arriving on a thread
        started before does not write the cache (a restarted agent may already be using it). Returns once a write
        under way is over: none is going on, nor starts, after it."""
        with self._lock:
            self._closed = True
        with self._save_lock:  # (a write that saw the agent open ends first; the next ones see it closed)
            pass

    def _bump(self) -> None:
        if self.cache is not None:
            with self._save_lock:  # the snapshot taken inside: an older state is never written last
                if not self._closed:  # (read under _save_lock, which close() takes after setting it)
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

    def _start(self, name: str, target: Any, *args: Any) -> bool:
        """Start `target(*args)` on a thread of its own behind a caller; False (nothing started: the caller undoes its
        marker) when the agent stopped or no thread could be made (the process at its limit: a marker left set
        would keep that work from ever being started again)."""
        if self._closed:
            return False
        try:
            threading.Thread(target=target, args=args, name=name, daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread"
            log.warning("%s not started behind the caller: %s", name, exc)
            return False
        return True

    def _land(self, flights: dict[K, _Flight[T]], key: K, flight: _Flight[T]) -> None:
        """The request `flight` stands for is over (its outcome set): the next ask sends its own, the waiters wake."""
        with self._lock:
            if flights.get(key) is flight:
                del flights[key]
        flight.done.set()

    # ------------------------------------------------------------------ placements
    def _placements_due(self) -> bool:
        """refresh_every passed since the last read, or the clock went back past it (a wall clock stepped back must
        not hold the refreshes, which drop unplaced workloads, until it is back where it was); and the floor after a
        failed read is over (`_placements_later`). The caller holds the lock."""
        if time.monotonic() < self._placements_retry_at:
            return False
        return not 0.0 <= self.clock() - self._placements_at < self.refresh_every

    def _placements_later(self, exc: Unreachable | Refused) -> None:
        """A placements read failed: none is sent again (but a forced one) before the server's Retry-After, or else a
        backoff doubling from PLACEMENTS_BACKOFF_MIN per failure in a row with jitter; either at most
        PLACEMENTS_WAIT_MAX, and up to 10% more. Before the first sync, the callers meanwhile are answered at once
        without a request: a fleet of restarted agents asks a recovering server once per floor each, not once per
        Workload API call, and re-syncs within the floor once it is back. The caller holds the lock."""
        wait = retry_wait(self._placements_failures, exc.retry_after if isinstance(exc, Refused) else None,
                          self._jitter, least=PLACEMENTS_BACKOFF_MIN, most=PLACEMENTS_WAIT_MAX,
                          after_most=PLACEMENTS_WAIT_MAX)
        self._placements_failures += 1
        self._placements_retry_at = time.monotonic() + wait
        self._placements_why = str(exc)
        if not self.synced:
            log.warning("workload identities not re-synced (the Workload API answers UNAVAILABLE meanwhile); the "
                        "placements are read again in %.1fs: %s", wait, exc)

    def refresh_placements(self, force: bool = False) -> None:
        """Read the node's placements (every `refresh_every` s, or now with `force` or before the first sync);
        the first time after a start also the CRL, when SVIDs came from the cache. One read in flight at a time:
        meanwhile, once synced, the others go on with the known placements; before the first sync they wait for it
        (bounded by the read's own bound), and `force` waits for it, then reads again (it may predate the change the
        caller wants seen). After a failed read, none is sent before its floor (`_placements_later`) but a forced
        one: before the first sync, Unreachable at once meanwhile."""
        deadline: float | None = None
        while True:
            with self._lock:
                if self.synced and not force and not self._placements_due():
                    return
                flight = self._placements_flight
                if flight is None:
                    wait = self._placements_retry_at - time.monotonic()
                    if wait > 0 and not force:  # (not synced: _placements_due said so above)
                        raise Unreachable(f"the node's placements: {self._placements_why} (read again in {wait:.1f}s)")
                    flight = self._placements_flight = _Flight()
                    synced, cached = self.synced, bool(self._x509)
                    break
                if self.synced and not force:  # one in flight: the known placements serve meanwhile
                    return
                if deadline is None:  # the in-flight read's bound: two requests before the first sync, one after
                    deadline = time.monotonic() + (self._flight_wait if self.synced
                                                   else 2 * self.resync_timeout + FLIGHT_MARGIN)
            if not flight.wait(deadline):
                raise Unreachable("the node's placements: the server has not answered yet")
            if not force:
                if flight.error is not None:
                    raise flight.error.with_traceback(None)
                if not self.synced:
                    raise Unreachable("the node's placements: not read")
                return
        changed = False
        try:
            timeout = None if synced else self.resync_timeout
            try:
                try:
                    rows = self.api.placements(timeout=timeout)
                    revoked = self.api.revoked_serials(timeout=timeout) if not synced and cached else set()
                    new = _placements_of(rows)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:  # an answer not read: as a 5xx
                    raise Refused(200, f"the placements answer is unusable: {exc!r}") from None
            except (Unreachable, Refused) as exc:
                flight.error = exc
                with self._lock:
                    self._placements_later(exc)
                    if synced:  # what is known serves meanwhile; asked again when due, not at every ask
                        self._placements_at = self.clock()
                raise
            with self._lock:
                changed = self._apply_placements(new, revoked)
        finally:
            with self._lock:
                if self._placements_flight is flight:
                    self._placements_flight = None
            flight.done.set()
        if changed:
            self._bump()

    def _apply_placements(self, new: dict[str, Placement], revoked: set[int]) -> bool:
        """Take the placements read (and the CRL's serials): drop the SVIDs of workloads unplaced, moved or revoked,
        and mark them dropped for the answers in flight. True when anything changed. The caller holds the lock."""
        self._placements_at = self.clock()
        self._placements_retry_at, self._placements_failures = 0.0, 0
        dropped = [w for w, e in self._x509.items()
                   if w not in new or new[w].spiffe_id != e.spiffe_id or e.serial() in revoked]
        first, self.synced = not self.synced, True
        known = set(self.placements) | set(self._x509) | set(self._x509_flights) | {k[0] for k in self._jwt} \
            | {k[0] for k in self._jwt_flights}
        gone = {w for w in known if w not in new or (w in self.placements
                                                       and self.placements[w].spiffe_id != new[w].spiffe_id)}
        for w in gone | set(dropped):  # an answer asked before now, still in flight, is for what is no longer so
            self._drops[w] = self._drops.get(w, 0) + 1
            self._jwt_drops[w] = self._jwt_drops.get(w, 0) + 1
        in_flight = set(self._x509_flights) | {k[0] for k in self._jwt_flights}
        for counts in (self._drops, self._jwt_drops):  # (no ticket holds the count of one unplaced and not in flight)
            for w in [w for w in counts if w not in new and w not in in_flight]:
                del counts[w]
        if new == self.placements and not dropped:
            if first and self.from_cache:
                log.info("re-synced: %d cached workload SVIDs confirmed", self.from_cache)
            return False
        for w in dropped:
            self._x509.pop(w, None)
        for w in [w for w in self._retry_at if w not in new]:
            self._settled(w)
        for w in [w for w in self._jwt_retry_at if w not in new]:
            self._jwt_retry_at.pop(w, None)
            self._jwt_failures.pop(w, None)
        if first and self.from_cache:
            log.info("re-synced: %d cached workload SVIDs confirmed, %d dropped (unplaced, moved or revoked)",
                     self.from_cache - len(dropped), len(dropped))
        self.placements = new
        self._jwt = {k: v for k, v in self._jwt.items() if k[0] in new}
        return True

    def for_caller(self, matches: Any) -> list[Placement]:
        """The placements whose selectors the caller matches (`matches(selectors) -> bool`); NotSynced while a
        restarted agent has not heard from the server (its cache is not served unconfirmed). Once synced, a caller
        never waits for the server: a refresh due is started behind it, and it gets the known placements."""
        if self.synced:
            self._refresh_behind()
        else:
            try:
                self.refresh_placements()
            except (Unreachable, Refused) as exc:
                if not self.synced:
                    raise NotSynced(f"re-syncing with the server: {exc}") from None
        with self._lock:
            return [p for p in sorted(self.placements.values(), key=lambda p: p.workload) if matches(p.selectors)]

    def _refresh_behind(self) -> None:
        """Refresh the placements on a thread of its own when due and none is under way (its changes wake the
        streams)."""
        with self._lock:
            if self._closed or self._refreshing or self._placements_flight is not None \
                    or not self._placements_due():
                return
            self._refreshing = True
        if not self._start("agent-placements", self._refresh_quietly):
            with self._lock:
                self._refreshing = False

    def _refresh_quietly(self) -> None:
        try:
            self.refresh_placements()
        except (Unreachable, Refused) as exc:  # synced: what is known serves (fail static), asked again when due
            log.warning("placements not refreshed: %s", exc)
        except Exception:
            log.exception("placements not refreshed")
        finally:
            with self._lock:
                self._refreshing = False

    # ------------------------------------------------------------------ X.509
    def x509(self, workload: str, *, held_ok: bool = False) -> X509Entry | None:
        """The workload's current X.509-SVID, fetched or renewed when due; None when the server refuses it for good
        (DEFINITIVE: dropped). A transient failure (the module docstring) keeps the held one while it is valid and
        asks again no sooner than `_later` says; RetryLater when nothing valid is held meanwhile. While its request
        (or a batch with it) is in flight, the held one is served while valid, else that request's outcome is
        waited for (bounded: RetryLater). With `held_ok` (a Workload API caller, whose renewal `renew_behind`
        started), a held one past half life is served while valid, not renewed here."""
        deadline = time.monotonic() + self._flight_wait
        while True:
            with self._lock:
                entry = self._x509.get(workload)
                now = self.clock()
                if entry is not None and (now < entry.renew_at() or (held_ok and now < entry.not_after)):
                    return entry
                flight = self._x509_flights.get(workload)
                if flight is None:
                    if now < self._retry_at.get(workload, 0.0):  # failed a moment ago: not asked again before then
                        return self._held(workload, entry, now, "waiting to retry")
                    flight = self._x509_flights[workload] = _Flight()
                    ticket = self._ticket(workload)
                    break
                if entry is not None and now < entry.not_after:  # its renewal is in flight: the held one meanwhile
                    return entry
            if not flight.wait(deadline):
                raise RetryLater(f"{workload}: no X.509-SVID yet (its request to the server is unanswered); retry")
            if flight.dropped:
                return None
            if flight.result is not None:
                return flight.result
            if flight.failed is not None:
                with self._lock:
                    return self._held(workload, self._x509.get(workload), self.clock(), flight.failed)
            # nothing decided (a batch the server has no route for, or refused whole as too large): asked again
        return self._ask_x509(workload, flight, ticket)

    def _ask_x509(self, workload: str, flight: _Flight[X509Entry], ticket: tuple[int, int]) -> X509Entry | None:
        """Send the request `flight` stands for (outside the lock) and apply its answer (under it)."""
        outcome: X509Entry | Refused | Unreachable
        changed = False
        try:
            key, csr = new_key_and_csr(workload)
            try:
                outcome = _entry(self.api.x509_svid(workload, csr), key, workload)
            except (Refused, Unreachable) as exc:
                outcome = exc
            except (KeyError, TypeError, ValueError) as exc:  # nothing held from it; transient (never in a loop)
                outcome = Refused(200, f"the server's answer is unusable: {exc}")
            with self._lock:
                if isinstance(outcome, X509Entry):
                    flight.result = self._keep(workload, outcome, ticket)
                    flight.dropped = flight.result is None
                    changed = flight.result is outcome
                elif isinstance(outcome, Refused) and definitive(outcome.status):
                    log.warning("%s: no X.509-SVID: %s", workload, outcome)
                    changed = self._drop_x509(workload)
                    flight.dropped = True
                elif self._stale(workload, ticket):  # dropped while in flight: nothing to retry
                    flight.dropped = True
                else:  # transient: keep serving the one we have while it is valid
                    self._later([workload], outcome, outcome.retry_after if isinstance(outcome, Refused) else None)
                    flight.failed = str(outcome) if isinstance(outcome, Refused) \
                        else f"server unreachable: {outcome}"
        finally:
            self._land(self._x509_flights, workload, flight)
        if changed and flight.result is not None:
            self.metrics.svid_expiry.labels(flight.result.spiffe_id).set(flight.result.not_after)
        if changed:
            self._bump()
        if flight.failed is not None:
            with self._lock:
                return self._held(workload, self._x509.get(workload), self.clock(), flight.failed)
        return flight.result

    def _ticket(self, workload: str) -> tuple[int, int]:
        """What an answer to a request asked now is checked against when it arrives. The caller holds the lock."""
        return self._drops.get(workload, 0), self._rotations

    def _stale(self, workload: str, ticket: tuple[int, int]) -> bool:
        """The workload was dropped since `ticket` (refused for good, unplaced, moved, revoked). The caller holds the
        lock."""
        return self._drops.get(workload, 0) != ticket[0]

    def _keep(self, workload: str, fresh: X509Entry, ticket: tuple[int, int]) -> X509Entry | None:
        """Hold an issued SVID, unless the workload was dropped since it was asked (a late answer never resurrects
        it: None) or a newer one is held (never replaced by an older one: that one). Asked before a CA rotation, it
        stays due (the old CA may have signed it). The caller holds the lock."""
        if self._stale(workload, ticket):
            log.info("%s: an X.509-SVID answered after the workload was dropped is discarded", workload)
            return None
        held = self._x509.get(workload)
        if held is not None and held.not_before > fresh.not_before:
            return held
        if ticket[1] != self._rotations:
            fresh = replace(fresh, forced=True)
        self._x509[workload] = fresh
        self._settled(workload)
        return fresh

    def _drop_x509(self, workload: str) -> bool:
        """A definitive refusal: the workload's X.509-SVID and JWT-SVIDs go, no retry is pending, and answers in
        flight for it are stale. True when an X.509-SVID was held. The caller holds the lock."""
        self._settled(workload)
        self._drop_jwts(workload)
        self._drops[workload] = self._drops.get(workload, 0) + 1
        return self._x509.pop(workload, None) is not None

    def _held(self, workload: str, entry: X509Entry | None, now: float, why: str) -> X509Entry:
        """The held SVID while it is valid (a renewal failed transiently); RetryLater when there is none."""
        if entry is not None and now < entry.not_after:
            return entry
        raise RetryLater(f"{workload}: no X.509-SVID yet ({why}); retry")

    def _later(self, workloads: list[str], exc: AgentError, retry_after: float | None) -> None:
        """A transient failure of `workloads`' renewal: none is asked again before the server's Retry-After (up to
        10% more, spread), or else a backoff doubling from BACKOFF_MIN to BACKOFF_MAX with jitter. The caller holds
        the lock."""
        now = self.clock()
        failures = max(self._failures.get(w, 0) for w in workloads)
        wait = retry_wait(failures, retry_after, self._jitter)
        for w in workloads:  # one time for all: they stay one batch when asked again
            self._failures[w] = failures + 1
            self._retry_at[w] = now + wait
        level = logging.ERROR if isinstance(exc, Refused) and exc.status == 400 else logging.WARNING
        what = workloads[0] if len(workloads) == 1 else f"{len(workloads)} workloads"
        log.log(level, "%s: X.509-SVID not renewed, the one held is kept while valid; retrying in %.1fs: %s",
                what, wait, exc)

    def _settled(self, workload: str) -> None:
        """The workload's renewal succeeded, or it was dropped: no retry pending. The caller holds the lock."""
        self._retry_at.pop(workload, None)
        self._failures.pop(workload, None)

    def renew_behind(self, workloads: Collection[str]) -> None:
        """Renew those of `workloads` that are due (renew_due) on a thread of its own: the Workload API caller they
        belong to is answered from their held SVIDs while valid, and never waits for the server about them. The
        workloads are claimed (`_behind`) until that thread is done with them: a caller asking in a loop starts no
        further thread for them meanwhile (their request is in flight only once the thread got that far), so such
        threads are at most one per workload."""
        with self._lock:
            now = self.clock()
            due = frozenset(w for w in workloads if w in self._x509 and now >= self._x509[w].renew_at()
                            and now >= self._retry_at.get(w, 0.0) and w not in self._x509_flights
                            and w not in self._behind)
            if self._closed or not due:
                return
            self._behind |= due
        if not self._start("agent-renew", self._renew_quietly, due):
            with self._lock:
                self._behind -= due

    def _renew_quietly(self, workloads: frozenset[str]) -> None:
        try:
            self.renew_due(only=workloads)
        except Exception:  # (the failures the rules name are handled in renew_due; this is anything else)
            log.exception("workload SVIDs not renewed")
        finally:
            with self._lock:
                self._behind -= workloads

    def renew_due(self, only: Collection[str] | None = None) -> None:
        """Renew every cached X.509-SVID past half life (the streams then send the new one) whose last transient
        failure's wait is over and that is not being renewed already (of `only`, when given): in batches of up to
        BATCH (POST /v1/svids/x509/batch, one request each), smaller once the server refused one as too large, one
        request each on a server without that route."""
        with self._lock:
            now = self.clock()
            due = [w for w, e in self._x509.items() if (only is None or w in only) and now >= e.renew_at()
                   and now >= self._retry_at.get(w, 0.0) and w not in self._x509_flights]
        if not self.batches:
            self._renew_singly(due)
            return
        while due:
            size = BATCH if self.batch_limit is None else max(1, min(BATCH, self.batch_limit))
            chunk, due = due[:size], due[size:]
            outcome = self._renew_batch(chunk)
            if outcome == _NO_ROUTE:  # an older server (during an upgrade): one request each from now on
                log.info("the server has no batch SVID route; renewing one request per workload")
                self.batches = False
                self._renew_singly(chunk + due)
                return
            if outcome == _HELD:  # refused whole for now (rate limited, down): the rest would be too; they wait as long
                with self._lock:
                    until = max(self._retry_at.get(w, 0.0) for w in chunk)
                    for w in due:
                        self._retry_at[w] = max(self._retry_at.get(w, 0.0), until)
                return
            if outcome > 0:  # refused whole as too large: the same workloads again in smaller batches
                self.batch_limit = outcome
                log.warning("the server refused a batch of %d SVID renewals as too large; sending %d at most",
                            len(chunk), outcome)
                due = chunk + due

    def _renew_singly(self, workloads: list[str]) -> None:
        for w in workloads:
            with suppress(RetryLater):  # (logged by x509) the held one was no longer valid; asked again later
                self.x509(w)

    def _renew_batch(self, workloads: list[str]) -> int:
        """Renew `workloads` in one request, each handled as `x509` handles its renewal: a definitive refusal (of
        its entry, or of the request as a whole) drops it; a transient one (or no answer) keeps the one held while
        valid and retries later. _DONE; _HELD when the request as a whole failed so (the others due wait as long: the
        server would refuse them too); _NO_ROUTE (nothing changed) when the server has no batch route; or, when it
        refused the batch whole as too large and it had more than one entry, the smaller size to send instead.
        Its workloads are in flight meanwhile: an ask for one of them is served the held one, or waits for this."""
        with self._lock:
            now = self.clock()
            due = [w for w in workloads if w in self._x509 and now >= self._x509[w].renew_at()
                   and now >= self._retry_at.get(w, 0.0)  # (not renewed, nor failed, meanwhile)
                   and w not in self._x509_flights]  # (nor being renewed)
            if not due:
                return _DONE
            flights: dict[str, _Flight[X509Entry]] = {w: _Flight() for w in due}
            self._x509_flights.update(flights)
            tickets = {w: self._ticket(w) for w in due}
        fresh: list[X509Entry] = []
        dropped = 0
        try:
            keys = {w: new_key_and_csr(w) for w in due}
            try:
                results: list[dict[str, Any]] = self.api.x509_svids([(w, keys[w][1]) for w in due])
            except Refused as exc:
                if exc.status in (404, 405):
                    return _NO_ROUTE
                if _too_large(exc.status) and len(due) > 1:
                    return max(1, len(due) // 2)
                if not definitive(exc.status):
                    self._held_back(flights, tickets, exc, exc.retry_after, str(exc))
                    return _HELD
                results = [{"error": {"status": exc.status, "reason": str(exc)}}] * len(due)
            except Unreachable as exc:  # keep serving the ones we have while they are valid (x509 serves them so)
                self._held_back(flights, tickets, exc, None, f"server unreachable: {exc}")
                return _HELD
            with self._lock:
                for w, result in zip(due, results, strict=True):
                    flight = flights[w]
                    error = result.get("error")
                    svid = result.get("svid")
                    if error or not isinstance(svid, dict):
                        status = error.get("status") if isinstance(error, dict) else None
                        why = str(error.get("reason")) if isinstance(error, dict) else str(result)
                        if isinstance(status, int) and not definitive(status):
                            if self._stale(w, tickets[w]):  # dropped while in flight: nothing to retry
                                flight.dropped = True
                                continue
                            self._later([w], Refused(status, why), None)
                            flight.failed = f"{status}: {why}"
                            continue
                        reason = f"{status}: {why}" if status is not None else why
                        log.warning("%s: no X.509-SVID: %s", w, reason)
                        dropped += self._drop_x509(w)
                        flight.dropped = True
                        continue
                    try:
                        entry = _entry(svid, keys[w][0], w)
                    except (KeyError, TypeError, ValueError) as exc:
                        log.warning("%s: no X.509-SVID: the server's answer does not parse: %s", w, exc)
                        self._settled(w)
                        self._drops[w] = self._drops.get(w, 0) + 1
                        dropped += self._x509.pop(w, None) is not None
                        flight.dropped = True
                        continue
                    flight.result = self._keep(w, entry, tickets[w])
                    flight.dropped = flight.result is None
                    if flight.result is entry:
                        fresh.append(entry)
        finally:
            with self._lock:
                for w, flight in flights.items():
                    if self._x509_flights.get(w) is flight:
                        del self._x509_flights[w]
            for flight in flights.values():
                flight.done.set()
        for entry in fresh:
            self.metrics.svid_expiry.labels(entry.spiffe_id).set(entry.not_after)
        if fresh or dropped:
            self._bump()
        return _DONE

    def _held_back(self, flights: dict[str, _Flight[X509Entry]], tickets: dict[str, tuple[int, int]],
                   exc: AgentError, retry_after: float | None, why: str) -> None:
        """A batch refused whole for now (or unanswered): its workloads wait to retry (`_later`), but for those dropped
        while it was in flight (unplaced: nothing to retry; a wait kept would hold back their first fetch once placed
        again)."""
        with self._lock:
            live = [w for w in flights if not self._stale(w, tickets[w])]
            if live:
                self._later(live, exc, retry_after)
        for w, flight in flights.items():
            if w in live:
                flight.failed = why
            else:
                flight.dropped = True

    def rotate_all(self) -> None:
        """Renew every cached X.509-SVID now (the trust bundle changed: a new CA generation signs)."""
        with self._lock:  # due now, still valid until their own expiry (served meanwhile, should renewals fail)
            self._x509 = {w: replace(e, forced=True) for w, e in self._x509.items()}
            self._rotations += 1  # (an answer in flight, maybe the old CA's, is held due: renewed at the next round)
            for w in list(self._retry_at):  # a new CA: worth asking at once
                self._retry_at.pop(w)
        self.renew_due()

    # ------------------------------------------------------------------ JWT
    def _drop_jwts(self, workload: str) -> None:
        """A definitive refusal (of an X.509-SVID, or of a JWT-SVID for any audience) is about the workload (revoked,
        quarantined, unplaced, unknown) or its node, never about an audience (a bad one is answered 400/422): every
        JWT-SVID held for the workload goes with it, never served again, nor one in flight for it. The caller holds
        the lock."""
        self._jwt = {k: v for k, v in self._jwt.items() if k[0] != workload}
        self._jwt_drops[workload] = self._jwt_drops.get(workload, 0) + 1

    @staticmethod
    def _jwt_held(workload: str, entry: JwtEntry | None, now: float, why: AgentError | str) -> JwtEntry:
        """The held JWT-SVID while it is valid (a fetch failed transiently); RetryLater when there is none."""
        if entry is not None and now < entry.expires:
            return entry
        raise RetryLater(f"{workload}: no JWT-SVID yet ({why}); retry")

    def _jwt_later(self, workload: str, retry_after: float | None, exc: AgentError) -> None:
        """A JWT-SVID fetch for `workload` failed on the server's side (429, 5xx, no answer): none is asked for it
        again before the server's Retry-After, or a backoff (retry_wait), as for its X.509-SVID: never in a loop.
        Logged here, once per failure. The caller holds the lock."""
        failures = self._jwt_failures.get(workload, 0)
        self._jwt_failures[workload] = failures + 1
        wait = retry_wait(failures, retry_after, self._jitter)
        self._jwt_retry_at[workload] = self.clock() + wait
        log.warning("%s: JWT-SVID not fetched, retrying in %.1fs (the one held, if any, is served while valid): %s",
                    workload, wait, exc)

    def _jwt_bounds(self, workload: str) -> bool:
        """A fetch for `workload` is within the agent's bounds, and taken from them: its own (JWT_PER_WORKLOAD), and
        its share of the node's (JWT_PER_NODE, shared fairly: core.ratelimit.FairBucket). A fetch the node's bound
        refuses costs the workload's own nothing. The caller holds the lock."""
        if self._jwt_asks.take(workload) > 0:
            return False
        if not self._jwt_node.take(workload):
            self._jwt_asks.give_back(workload)
            return False
        return True

    def jwt(self, workload: str, audience: list[str], *, held_ok: bool = False) -> JwtEntry | None:
        """The workload's JWT-SVID for `audience`, fetched when none is held or past half life (the module docstring
        has the rules). One fetch per (workload, audience) in flight: meanwhile the held one while valid, else that
        fetch's outcome (bounded: RetryLater). With `held_ok` (a Workload API caller), a held one past half life is
        answered at once while valid, the new one fetched behind it."""
        key = (workload, tuple(sorted(audience)))
        deadline = time.monotonic() + self._flight_wait
        while True:
            with self._lock:
                entry = self._jwt.get(key)
                now = self.clock()
                if entry is not None and now < entry.issued + (entry.expires - entry.issued) / 2:
                    return entry
                flight = self._jwt_flights.get(key)
                if flight is None:
                    # not asked of the server (said once, when it failed or never: a workload asking in a loop must
                    # not flood the log): the server failed a moment ago, or this is over the agent's bounds
                    waiting = now < self._jwt_retry_at.get(workload, 0.0)
                    if waiting or not self._jwt_bounds(workload):
                        if entry is not None and now < entry.expires:
                            return entry
                        why = "waiting to retry after the server's refusal" if waiting \
                            else "JWT-SVIDs asked for too often"
                        raise RetryLater(f"{workload}: no JWT-SVID yet ({why}); retry")
                    flight = self._jwt_flights[key] = _Flight()
                    drops = self._jwt_drops.get(workload, 0)
                    break
                if entry is not None and now < entry.expires:  # being fetched again: the held one meanwhile
                    return entry
            if not flight.wait(deadline):
                raise RetryLater(f"{workload}: no JWT-SVID yet (its request to the server is unanswered); retry")
            if flight.dropped:
                return None
            if flight.result is not None:
                return flight.result
            if flight.failed is not None:
                with self._lock:
                    return self._jwt_held(workload, self._jwt.get(key), self.clock(), flight.failed)
            # nothing decided (its sender raised what the rules do not name): asked again
        if held_ok and entry is not None and now < entry.expires:
            if not self._start("agent-jwt", self._fetch_behind, key, flight, drops, now):
                self._land(self._jwt_flights, key, flight)  # (nothing fetched: asked again at the next ask)
            return entry
        try:
            return self._ask_jwt(key, flight, drops, now)
        finally:
            self._land(self._jwt_flights, key, flight)

    def _fetch_behind(self, key: tuple[str, tuple[str, ...]], flight: _Flight[JwtEntry], drops: int,
                      now: float) -> None:
        try:
            self._ask_jwt(key, flight, drops, now)
        except RetryLater:  # (the held one expired meanwhile; the failure is logged by the rules)
            pass
        except Exception:
            log.exception("%s: JWT-SVID not fetched", key[0])
        finally:
            self._land(self._jwt_flights, key, flight)

    def _ask_jwt(self, key: tuple[str, tuple[str, ...]], flight: _Flight[JwtEntry], drops: int,
                 now: float) -> JwtEntry | None:
        """Send the fetch `flight` stands for (outside the lock) and apply its answer (under it)."""
        workload, audience = key
        try:
            issued = self.api.jwt_svid(workload, list(audience))
        except Refused as exc:
            with self._lock:
                if definitive(exc.status):
                    log.warning("%s: no JWT-SVID: %s", workload, exc)
                    self._drop_jwts(workload)
                    flight.dropped = True
                    return None
                if self._jwt_drops.get(workload, 0) != drops:  # dropped while in flight: nothing to retry
                    flight.dropped = True
                    return None
                if exc.status == 429 or exc.status >= 500:  # the server's state, not this request's: as X.509's rule
                    self._jwt_later(workload, exc.retry_after, exc)
                else:  # this request's (400, 409): asked again at the next ask
                    log.warning("%s: JWT-SVID refused, the one held (if any) is served while valid: %s", workload, exc)
                flight.failed = str(exc)
                return self._jwt_held(workload, self._jwt.get(key), now, exc)
        except Unreachable as exc:
            with self._lock:
                if self._jwt_drops.get(workload, 0) != drops:  # dropped while in flight: nothing to retry
                    flight.dropped = True
                    return None
                self._jwt_later(workload, None, exc)
                flight.failed = str(exc)
                return self._jwt_held(workload, self._jwt.get(key), now, exc)
        try:
            fresh = _jwt_entry(issued, workload, audience, now)
        except (KeyError, TypeError, ValueError, InvalidSpiffeId, pyjwt.PyJWTError) as exc:  # never held: as a 5xx
            unusable = Refused(200, f"the server's answer is unusable: {exc}")
            with self._lock:
                self._jwt_later(workload, None, unusable)
                flight.failed = str(unusable)
                return self._jwt_held(workload, self._jwt.get(key), now, unusable)
        with self._lock:
            if self._jwt_drops.get(workload, 0) != drops:  # dropped while in flight: a late answer never resurrects
                log.info("%s: a JWT-SVID answered after the workload's were dropped is discarded", workload)
                flight.dropped = True
                return None
            self._jwt_retry_at.pop(workload, None)
            self._jwt_failures.pop(workload, None)
            held = self._jwt.get(key)
            if held is not None and held.issued > fresh.issued:  # never replaced by an older one
                flight.result = held
                return held
            self._jwt.pop(key, None)
            self._jwt[key] = fresh  # (the newest last: dicts keep insertion order)
            mine = [k for k in self._jwt if k[0] == workload]
            for old in mine[:max(0, len(mine) - JWT_AUDIENCES)]:  # the oldest fetched first
                del self._jwt[old]
            flight.result = fresh
            return fresh
