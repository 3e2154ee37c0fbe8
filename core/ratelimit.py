"""Token buckets: `rate` tokens a second per key, at most `burst` saved up. The API's rate limits per client address
and per principal (api/limits.py), and the node agent's own limits on what its workloads make it ask the server
(agent/svids.py): one implementation for both; and one bucket shared fairly by keys (FairBucket: a node's JWT-SVID
fetches, which its workloads cause)."""

from __future__ import annotations

import math
import threading
import time

from core.errors import RateLimited, TrustfabricError


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


class FairBucket:
    """One token bucket (`rate` tokens a second, at most `burst` saved up) shared by keys so that busy ones cannot
    starve the others: the node agent's bound on the JWT-SVID fetches of all its workloads (agent/svids.py).

    - A key takes at most its share while others ask: `rate / n` a second and `(burst - reserve) / n` saved up (at
      least one), n being the keys that asked within the last `window` seconds, itself included. A share refills at
      the rate of the moment; a key that has not asked within the window no longer counts in n, and finds its share
      as it refilled meanwhile (whole once it has refilled, and then forgotten).
    - The bucket's last `reserve` tokens go only to a key that had not asked within the window: busy keys stop short
      of them, so a quiet key's first take is not spent by the busy ones. Such takes are bounded themselves (at most
      `reserve` at once, refilled at half the rate): keys that each come back just after the window, "quiet" every
      time, cannot keep the bucket below the reserve and a busy key from every token for ever.
    - The bucket bounds the sum: never more than `burst + rate * t` taken in any t seconds, whatever the keys do.
    Thread-safe, in-process; `rate <= 0` disables it (as TokenBucket)."""

    def __init__(self, rate: float, burst: int, *, reserve: int, window: float) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.reserve = max(0, min(reserve, self.burst - 1))
        self.window = window
        self._tokens = float(self.burst)  # the shared bucket's, at `_at`
        self._at: float | None = None
        self._spare = float(self.reserve)  # takes below the reserve line the quiet keys may still make, at `_at`
        self._shares: dict[str, tuple[float, float]] = {}  # key -> its share's tokens, and when
        self._asked: dict[str, float] = {}  # key -> when it last asked (the oldest first: dicts keep their order)
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> bool:
        """Take one token for `key`: True when taken; False (nothing taken) when it is over its share, or the bucket
        is empty (for a key that asked within the window: down to the reserve)."""
        if self.rate <= 0:
            return True
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._asked:  # forget the keys gone quiet
                oldest, at = next(iter(self._asked.items()))
                if now - at < self.window:
                    break
                del self._asked[oldest]  # (its share is kept while it is not whole again: see _forget_whole)
            quiet = key not in self._asked
            self._asked.pop(key, None)
            self._asked[key] = now
            n = len(self._asked)
            cap = max(1.0, (self.burst - self.reserve) / n)
            share, at = self._shares.get(key, (cap, now))
            share = min(cap, share + max(0.0, now - at) * self.rate / n)
            tokens = self._tokens if self._at is None \
                else min(float(self.burst), self._tokens + max(0.0, now - self._at) * self.rate)
            spare = float(self.reserve) if self._at is None \
                else min(float(self.reserve), self._spare + max(0.0, now - self._at) * self.rate / 2)
            below = tokens < 1.0 + self.reserve  # (a take that reaches into the reserve)
            taken = share >= 1.0 and tokens >= 1.0 and (not below or (quiet and spare >= 1.0))
            spent = 1.0 if taken else 0.0
            self._shares[key] = (share - spent, now)
            if len(self._shares) > 2 * n + 16:
                self._forget_whole(now, n)
            self._tokens, self._at = tokens - spent, now
            self._spare = spare - (spent if below else 0.0)
            return taken

    def _forget_whole(self, now: float, n: int) -> None:
        """Forget the shares of the keys gone quiet that are whole again. Kept until then, a key coming back just
        after the window takes what its share refilled meanwhile, not a whole one each time (thirty keys asking every
        window and a bit took the whole bucket so). The caller holds the lock."""
        cap = max(1.0, (self.burst - self.reserve) / n)
        for key, (share, at) in list(self._shares.items()):
            if key not in self._asked and share + max(0.0, now - at) * self.rate / n >= cap:
                del self._shares[key]


class BatchAboveBurst(TrustfabricError):
    """A request that costs more rate-limit tokens than the principal's bucket can ever hold (one token per entry of a
    batch, more entries than the burst): refused whole, as a batch above its bound is (HTTP 422); never 429, whose
    Retry-After would promise a retry that cannot pass."""

    http_status = 422
