"""Request limits of the control-plane API: page sizes, a rate limit per client address applied before
anything else runs (by api/edge.py, so an unauthenticated flood costs one dictionary lookup per request,
never a token check or a database read), a rate limit per authenticated principal, and a limit on the policy
evaluations one tenant has in progress at once (EvaluationSlots). (The body-size limit, shared with the PDP,
is pure ASGI in core/asgi.py.)"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from api.metrics import REQUESTS
from core.asgi import Scope, Send, reject
from core.errors import PayloadTooLarge, RateLimited, TrustfabricError

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "BatchAboveBurst", "EvaluationSlots", "PayloadTooLarge", "RateLimited",
           "TokenBucket", "refused_address"]

RATE_LIMITED_ROUTE = "<rate-limited>"  # the route label of requests refused by ClientRateLimit (never routed)
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class TokenBucket:
    """Per-key token buckets: `rate` tokens a second, at most `burst` saved up. Thread-safe, in-process."""

    def __init__(self, rate: float, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.max_keys = max_keys
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """0 when allowed, else the seconds until a token is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens = self._tokens(key, now)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            if len(self._state) > self.max_keys:
                self._state.clear()
            return (1.0 - tokens) / self.rate

    def take_more(self, key: str, extra: int, now: float | None = None) -> float:
        """Take `extra` more tokens for a request that already took its one by `take` (a batch charged one token an
        entry): 0 when taken. Else nothing more is taken and the request's own token goes back too (a refused request
        costs nothing, as one `take` refuses), and the answer is the seconds until all 1 + `extra` are there;
        math.inf when they never can be (more than the burst: BatchAboveBurst says so). Atomic: no other request of
        `key` takes tokens between the check and the charge."""
        if self.rate <= 0 or extra <= 0:
            return 0.0
        if 1 + extra > self.burst:
            return math.inf
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens = self._tokens(key, now)
            if tokens >= extra:
                self._state[key] = (tokens - extra, now)
                return 0.0
            tokens = min(float(self.burst), tokens + 1.0)  # the request's own token, back
            self._state[key] = (tokens, now)
            return (1.0 + extra - tokens) / self.rate

    def _tokens(self, key: str, now: float) -> float:
        """`key`'s tokens at `now` (a full bucket for a key not seen, or forgotten); the caller holds the lock."""
        tokens, last = self._state.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + max(0.0, now - last) * self.rate)

    def give_back(self, key: str, tokens: int = 1) -> None:
        """Return `tokens` taken for `key` (never beyond the burst): a request refused after its principal was
        charged, whose principal turned out not to be the caller (a deferred token check: api/handoff.py)."""
        if self.rate <= 0:
            return
        with self._lock:
            state = self._state.get(key)
            if state is not None:
                self._state[key] = (min(float(self.burst), state[0] + tokens), state[1])

    def check(self, key: str) -> None:
        wait = self.take(key)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(f"rate limit exceeded for {key}; retry after {retry}s", retry)

    def check_more(self, key: str, extra: int, what: str) -> None:
        """`take_more` for a request of `key` that costs 1 + `extra` tokens (`what` names them in the reason):
        RateLimited with the seconds until they are all there, BatchAboveBurst when they never can be."""
        wait = self.take_more(key, extra)
        if wait == math.inf:
            raise BatchAboveBurst(
                f"{what} cost {1 + extra} rate-limit tokens, more than the burst of {self.burst} a principal may ever "
                f"hold (TRUSTFABRIC_RATE_LIMIT_BURST): it could never pass; send at most {self.burst} per request")
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(f"rate limit exceeded for {key}: {what} cost {1 + extra} tokens; retry after {retry}s",
                              retry)


class BatchAboveBurst(TrustfabricError):
    """A request that costs more rate-limit tokens than the principal's bucket can ever hold (one token per entry of a
    batch, more entries than the burst): refused whole, as a batch above its bound is (HTTP 422); never 429, whose
    Retry-After would promise a retry that cannot pass."""

    http_status = 422


async def refused_address(bucket: TokenBucket, scope: Scope, send: Send) -> bool:
    """A token bucket per client address (the TCP peer uvicorn reports), checked before routing, authentication
    and body reading (api/edge.py): over the limit is answered 429 with Retry-After and the project's error
    shape, counted, not logged (a flood must not flood the log), and True is returned. Per process: with N
    workers a client gets up to N times the rate."""
    client = scope.get("client")
    address = str(client[0]) if client else "unknown"
    wait = bucket.take(address)
    if wait <= 0:
        return False
    REQUESTS.labels(scope["method"], RATE_LIMITED_ROUTE, "429").inc()
    retry = max(1, math.ceil(wait))
    await reject(send, 429, "rate_limited", f"too many requests from {address}; retry after {retry}s",
                 ((b"retry-after", str(retry).encode()),))
    return True


class EvaluationSlots:
    """At most `limit` policy evaluations in progress at once per key (a tenant, or a platform principal),
    per process; one more is refused at once with 429 and Retry-After, naming the limit (issue 13, item 6).

    Why beside the rate limit: a token bucket bounds how often, not how much at once; a tenant looping an
    evaluating endpoint from many connections would otherwise hold as many worker threads, and as large a
    share of the interpreter, as it opens connections, and every other tenant's requests queue behind it.
    A small bound (2 by default, so two of a tenant's members explaining at the same moment are both served)
    costs the tenant little: evaluations in one process take turns on the interpreter lock anyway
    (bench/noisy.py: its explain rate stays about the same). Refused at once rather than queued: a queued
    request would still hold a worker thread while it waits."""

    SETTING = "TRUSTFABRIC_POLICY_CONCURRENCY"

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, key: str, who: str) -> Iterator[None]:
        """One slot of `key` for the block; RateLimited naming `who` and the limit when none is free."""
        if self.limit <= 0:
            yield
            return
        with self._lock:
            busy = self._busy.get(key, 0)
            if busy >= self.limit:
                plural = "s" if self.limit != 1 else ""
                raise RateLimited(f"{who} is at its limit of {self.limit} policy evaluation{plural} in progress at "
                                  f"once ({self.SETTING}={self.limit}); retry after 1s", 1)
            self._busy[key] = busy + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy[key] - 1
                if left:
                    self._busy[key] = left
                else:
                    del self._busy[key]

    def busy(self, key: str) -> int:
        with self._lock:
            return self._busy.get(key, 0)
