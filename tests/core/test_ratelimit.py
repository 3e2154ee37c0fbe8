"""core/ratelimit.py's FairBucket, the node agent's bound on its workloads' JWT-SVID fetches (agent/svids.py), on an
injected clock: the bucket bounds the sum whatever the keys do; busy keys leave a quiet key's first take; none takes
more than its share while the others ask, nor starves a busy key with keys that come back just after the window
(review-agent). (TokenBucket's own tests are in tests/api/test_limits.py.)"""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from core.ratelimit import FairBucket, TokenBucket

RATE, BURST, RESERVE, WINDOW = 10.0, 20, 4, 2.0  # the agent's (JWT_PER_NODE, JWT_NODE_RESERVE, JWT_BUSY_WINDOW)


def _bucket() -> FairBucket:
    return FairBucket(RATE, BURST, reserve=RESERVE, window=WINDOW)


@given(st.lists(st.tuples(st.integers(0, 12), st.floats(0.0, 0.3)), max_size=150))
def test_the_keys_together_never_take_more_than_the_bucket(asks: list[tuple[int, float]]) -> None:
    bucket, now, taken = _bucket(), 0.0, []
    for key, step in asks:
        now += step
        if bucket.take(f"k{key}", now):
            taken.append(now)
    for i in range(len(taken)):  # any span of takes: at most the burst and the rate over it
        for j in range(i, len(taken)):
            assert j - i + 1 <= BURST + RATE * (taken[j] - taken[i]) + 1e-6, (i, j)


def _busy(bucket: FairBucket | TokenBucket, keys: int, seconds: float) -> float:
    """`keys` keys each asking every 10 ms for `seconds`; the time it ends."""
    now = 0.0
    for step in range(int(seconds * 100)):
        now = step * 0.01
        for k in range(keys):
            if isinstance(bucket, FairBucket):
                bucket.take(f"busy{k}", now)
            else:
                bucket.take("node", now)
    return now


def test_busy_keys_leave_a_quiet_keys_first_take() -> None:
    """Should fix (agentfair): ten busy keys kept one node-wide TokenBucket empty, and a quiet key's first take was
    refused; they stop short of the reserve, which goes to keys that had not asked within the window."""
    alone = TokenBucket(RATE, BURST)  # the bound as it was: one bucket for the node
    now = _busy(alone, 10, 3.0)
    assert alone.take("node", now) > 0  # (the quiet workload's first fetch: UNAVAILABLE)
    fair = _bucket()
    now = _busy(fair, 10, 3.0)
    assert all(fair.take(f"quiet{q}", now) for q in range(RESERVE))  # as many as the reserve, at once
    assert not any(fair.take(f"busy{k}", now) for k in range(10))  # (the busy ones never reach into it)


def test_no_key_takes_more_than_its_share_while_others_ask() -> None:
    """Twenty keys asking every 10 ms for 10 s: each gets about rate/20 a second, and together about the rate."""
    bucket, taken = _bucket(), Counter[int]()
    for step in range(1000):
        for k in range(20):
            taken[k] += bucket.take(f"k{k}", step * 0.01)
    share = max(1.0, (BURST - RESERVE) / 20) + RATE / 20 * 10.0
    assert max(taken.values()) <= share + 1, taken  # (1 more: the first keys' shares before the others asked)
    assert min(taken.values()) >= share - 2, taken
    assert sum(taken.values()) >= (BURST - RESERVE) + RATE * 10.0 * 0.9, taken


def test_a_key_gone_quiet_finds_its_share_whole() -> None:
    bucket = _bucket()
    for step in range(300):  # two keys, busy for 3 s
        for k in ("a", "b"):
            bucket.take(k, step * 0.01)
    assert not bucket.take("a", 3.0)  # busy: its share, and the bucket above the reserve, spent
    assert bucket.take("a", 3.0 + WINDOW + 0.01)  # forgotten after the window: quiet again
    assert FairBucket(0, 1, reserve=0, window=1.0).take("a")  # disabled


def test_keys_asking_just_after_the_window_cannot_starve_a_busy_key() -> None:
    """Should fix (review-agent): a key that had not asked within the window took from the reserve, whatever its
    share: thirty keys each asking every 2.05 s (half their own bound of 1/s) came back "quiet" every time, took the
    bucket down to nothing together (15 a second for its 10), and a key asking every 100 ms never got another token
    after its first second. The quiet keys' takes from the reserve are now bounded too (at most `reserve` in any
    window): the bucket's refill above the reserve is shared by everyone."""
    bucket, now, got = _bucket(), 0.0, Counter[str]()
    period, keys = 2.05, 30
    asks = sorted([(i * period / keys + n * period, f"p{i}") for i in range(keys) for n in range(60)]
                  + [(0.05 + n * 0.1, "busy") for n in range(1200)])
    for now, key in asks:
        if now > 120.0:
            break
        if bucket.take(key, now) and now >= 60.0:
            got[key] += 1
    assert got["busy"] >= RATE / (keys + 1) * 60.0 * 0.5, got["busy"]  # half its share, in the second minute
