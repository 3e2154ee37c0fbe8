"""Request limits of the control-plane API: page sizes and a per-principal rate limit. (The body-size limit,
shared with the PDP, is pure ASGI in core/asgi.py.)"""

from __future__ import annotations

import math
import threading
import time

from core.errors import PayloadTooLarge, RateLimited

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "PayloadTooLarge", "RateLimited", "TokenBucket"]

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
            tokens, last = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            if len(self._state) > self.max_keys:
                self._state.clear()
            return (1.0 - tokens) / self.rate

    def check(self, key: str) -> None:
        wait = self.take(key)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(f"rate limit exceeded for {key}; retry after {retry}s", retry)
