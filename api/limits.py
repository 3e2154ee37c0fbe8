"""Request limits of the control-plane API: page sizes, a rate limit per client address applied before
anything else runs (by api/edge.py, so an unauthenticated flood costs one dictionary lookup per request,
never a token check or a database read), a rate limit per authenticated principal, and a limit on the policy
evaluations one tenant has in progress at once (EvaluationSlots). (The body-size limit, shared with the PDP,
is pure ASGI in core/asgi.py.)"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from api.metrics import REQUESTS
from core.asgi import Scope, Send, answer, reject
from core.errors import PayloadTooLarge, RateLimited
from core.ratelimit import BatchAboveBurst, TokenBucket

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "BatchAboveBurst", "EvaluationSlots", "PayloadTooLarge", "RateLimited",
           "TokenBucket", "refused_address"]

RATE_LIMITED_ROUTE = "<rate-limited>"  # the route label of requests refused by ClientRateLimit (never routed)
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


async def refused_address(bucket: TokenBucket, scope: Scope, send: Send) -> bool:
    """A token bucket per client address (the TCP peer uvicorn reports), checked before routing, authentication
    and body reading (api/edge.py): over the limit is answered 429 with Retry-After and the project's error
    shape (a console page: the console's error page, for the person's browser), counted, not logged (a flood
    must not flood the log), and True is returned. Per process: with N workers a client gets up to N times the
    rate."""
    client = scope.get("client")
    address = str(client[0]) if client else "unknown"
    wait = bucket.take(address)
    if wait <= 0:
        return False
    REQUESTS.labels(scope["method"], RATE_LIMITED_ROUTE, "429").inc()
    retry = max(1, math.ceil(wait))
    retry_after = (b"retry-after", str(retry).encode())
    # (imported here, not at the top: the console's modules import the API's, this one among them)
    from api.console.headers import console_headers
    from api.console.web import refused_page

    console = console_headers(scope)
    if console is None:
        await reject(send, 429, "rate_limited", f"too many requests from {address}; retry after {retry}s",
                     (retry_after,))
        return True
    # a console page (a person's browser): the console's error page, with the headers every console answer carries
    fragment = (b"hx-request", b"true") in scope.get("headers", ())
    page = refused_page(429, f"Too many requests from your address ({address}): wait {retry} second"
                             f"{'' if retry == 1 else 's'}, then reload the page.", fragment)
    headers = tuple((k.encode(), v.encode()) for k, v in console.items())
    await answer(send, 429, page, b"text/html; charset=utf-8", (retry_after, *headers))
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
