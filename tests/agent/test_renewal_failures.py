"""What a failed renewal does to the workload SVIDs a node agent holds, against a real server over mTLS with py-spiffe
as the workload (agent/svids.py's module docstring has the rules):

- rate limited (429: the server charges a batch one token per entry), the held SVIDs stay served by the Workload
  API, the agent asks again no sooner than Retry-After (never in a loop), and renews them once the bucket allows; a
  batch refused so holds back the round's next ones;
- a server answering 503 (with Retry-After) keeps them too (after a CA rotation made them all due as well), and
  renews them once it answers again; a workload with nothing valid held meanwhile gets UNAVAILABLE ("retry"),
  never PERMISSION_DENIED;
- a batch refused whole as above the server's burst (422) is sent again in halves: nothing dropped;
- a definitive refusal (403: the workload revoked) still drops the held SVID.

The agent's clock is moved to past the SVIDs' half life (the server's clock is frozen: their validity is what the
server signed); the server's rate limiter is a real TokenBucket put on the running app, as create_app puts the one
its settings name."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.api import Refused
from agent.runner import Agent
from agent.svids import RETRY_AFTER_MAX
from api.limits import TokenBucket
from api.metrics import REQUESTS
from tests.agent.harness import Served, gpu1_fabric, served_fabric
from tests.agent.test_at_rest import fetch_code, serials

pytestmark = pytest.mark.xdist_group("agent-renewal-failures")
N = 4
NAMES = [f"f{i}" for i in range(N)]
IDS = {f"spiffe://example.org/tenant/acme/group/train/{n}" for n in NAMES}
BATCH_PATH = "/v1/svids/x509/batch"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("agent-renewal-failures")
    with served_fabric(home / "srv", fabric_file=gpu1_fabric(home, [f"acme/train/{n}" for n in NAMES])) as s:
        for i, name in enumerate(NAMES):  # this test's uid is the workload of each
            r = s.env.call("PUT", f"/v1/fabric/placements/acme/train/{name}", "admin", json={
                "node": "gpu1", "port": f"pf1vf{i}", "ipv4": f"10.1.1.{10 + i}",
                "selectors": [f"unix:uid:{os.getuid()}"]})
            assert r.status_code == 200, r.text
        yield s


@pytest.fixture
def gpu1(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    """A started agent serving the Workload API, its N workloads' SVIDs fetched, and its clock moved to past their
    half life (before their expiry): every one is due."""
    public = Path(tempfile.mkdtemp(prefix=f"tfa{os.getpid()}-"))  # short: a unix socket path has 107 bytes
    public.chmod(0o755)
    old = served.agents.pop("gpu1", None)
    if old is not None:
        old.stop()
    agent = served.agent("gpu1", socket=public / "api.sock")
    try:
        assert set(serials(agent)) == IDS
        held = agent.svids._x509.values()
        offset = max(e.renew_at() for e in held) - time.time() + 1
        assert time.time() + offset < min(e.not_after for e in held) - 600
        monkeypatch.setattr(agent.svids, "clock", lambda: time.time() + offset)
        yield agent
    finally:
        served.agents.pop("gpu1").stop()
        shutil.rmtree(public, ignore_errors=True)


def _batches(status: str | None = None) -> float:
    statuses = [status] if status else ["200", "422", "429", "401"]
    return float(sum(REQUESTS.labels("POST", BATCH_PATH, s)._value.get() for s in statuses))


def _held(agent: Agent) -> dict[str, int]:
    return {e.spiffe_id: e.serial() for e in agent.svids._x509.values()}


def _renewed_within(agent: Agent, before: dict[str, int], seconds: float) -> bool:
    """renew_due called every 50 ms (as often as a busy Workload API and the maintenance thread would) until every
    held SVID is a new one, or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        agent.svids.renew_due()
        held = _held(agent)
        if set(held) == set(before) and all(held[i] != before[i] for i in before):
            return True
        time.sleep(0.05)
    return False


def test_a_rate_limited_renewal_keeps_the_held_svids_and_renews_once_allowed(served: Served, gpu1: Agent,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    before = _held(gpu1)
    assert set(before) == IDS
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=1.0, burst=N))
    for _ in range(N + 1):  # the node spends its bucket (a batch of N needs all of it)
        try:
            gpu1.api.placements()
        except Refused as exc:
            assert exc.status == 429 and exc.retry_after is not None and exc.retry_after >= 1
            break
    else:
        pytest.fail("the node's bucket did not run out")
    refused = _batches("429")
    gpu1.svids.renew_due()
    assert _batches("429") == refused + 1
    assert _held(gpu1) == before  # kept, not dropped
    assert serials(gpu1) == before  # and what the Workload API serves (it asked renew_due and x509: nothing sent)
    asked = _batches()
    assert _renewed_within(gpu1, before, 20)
    # three requests in about 4 s, each no sooner than the last one's Retry-After: 429 (no token for the request),
    # 429 (1 of the N there), then 200; never one per renew_due call (about 80 of them)
    assert _batches() - asked <= 4, _batches() - asked
    assert _batches("200") >= 1
    renewed = serials(gpu1)
    assert set(renewed) == IDS and all(renewed[i] != before[i] for i in IDS)


def test_a_batch_refused_for_now_holds_back_the_next_ones_of_the_round(served: Served, gpu1: Agent,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """N due in batches of N/2 (as 250 workloads after a CA rotation are 100 + 100 + 50): the first batch rate limited,
    the second is not sent into the same 429 but waits as long; both are renewed once the bucket allows."""
    import agent.svids as agent_svids

    before = _held(gpu1)
    monkeypatch.setattr(agent_svids, "BATCH", N // 2)
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=1.0, burst=N // 2))
    with pytest.raises(Refused):
        for _ in range(N):  # the node spends its bucket
            gpu1.api.placements()
    refused = _batches("429")
    gpu1.svids.renew_due()
    assert _batches("429") == refused + 1  # one batch asked, the other held back
    assert _held(gpu1) == before
    assert _renewed_within(gpu1, before, 20)


async def _draining(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A control plane that answers every request 503 with Retry-After (restarting, its database down): the API's
    own error shape, on the same port and certificate as the real server."""
    if scope["type"] != "http":
        return
    body = json.dumps({"error": "unavailable", "reason": "the database is unavailable; retry shortly"}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": body})


def test_a_server_answering_503_keeps_the_held_svids_and_they_renew_once_it_answers(served: Served,
                                                                                    gpu1: Agent) -> None:
    before = _held(gpu1)
    real = served.env.app
    served.stop()
    served.env.app = _draining  # type: ignore[assignment]
    served.start()
    try:
        with pytest.raises(Refused) as refused:
            gpu1.api.placements()
        assert refused.value.status == 503 and refused.value.retry_after == 1
        gpu1.svids.renew_due()
        assert _held(gpu1) == before
        assert serials(gpu1) == before  # served, the placements' refresh refused too
        gpu1.svids.rotate_all()  # (a new CA generation: every one due at once) still served while valid
        assert _held(gpu1) == before and serials(gpu1) == before
        # past their expiry nothing valid is held: "retry", never "no identity for you"
        expired = max(e.not_after for e in gpu1.svids._x509.values()) + 1
        clock = gpu1.svids.clock
        gpu1.svids.clock = lambda: expired
        gpu1.svids._retry_at.clear()  # (asked again at once, to get the server's 503 and not only the wait)
        try:
            assert fetch_code(gpu1) == grpc.StatusCode.UNAVAILABLE
        finally:
            gpu1.svids.clock = clock
            gpu1.svids._retry_at.clear()  # (the waits were reckoned on that later clock)
        assert _held(gpu1) == before  # an expired one is not served, but not dropped for a 503 either
    finally:
        served.stop()
        served.env.app = real
        served.start()
    assert _renewed_within(gpu1, before, 15)
    renewed = serials(gpu1)
    assert set(renewed) == IDS and all(renewed[i] != before[i] for i in IDS)


def test_a_batch_above_the_servers_burst_is_sent_again_in_halves(served: Served, gpu1: Agent,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    before = _held(gpu1)
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=100.0, burst=N // 2))
    too_large = _batches("422")
    assert _renewed_within(gpu1, before, 15)
    assert _batches("422") == too_large + 1  # once: the smaller size is kept
    assert gpu1.svids.batch_limit == N // 2 and gpu1.svids.batches


def test_a_refused_node_svid_renewal_keeps_the_node_svid_and_does_not_hold_back_the_round(
        served: Served, gpu1: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix: a refused renewal of the node's own SVID (429 here) raised out of the maintenance round, so the
    round's workload renewals were skipped, and it was asked again every round (each second) whatever the server's
    Retry-After said. Now the held node SVID is kept (valid: mTLS goes on using it), the round goes on to the
    workload SVIDs, and the node renewal waits for Retry-After."""
    from agent.identity import Svid

    held = gpu1.identity.svid
    assert held is not None
    monkeypatch.setattr(Svid, "renew_due", lambda self: self.not_before)  # the node SVID is due
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=1.0, burst=1))
    with pytest.raises(Refused):
        for _ in range(3):  # the node spends its bucket
            gpu1.api.placements()
    node_429 = REQUESTS.labels("POST", "/v1/nodes/renew", "429")._value.get()
    asked = _batches()
    gpu1.maintain(bundle=False)  # raised Refused before
    assert REQUESTS.labels("POST", "/v1/nodes/renew", "429")._value.get() == node_429 + 1
    assert gpu1.identity.svid == held  # kept
    assert _batches() == asked + 1  # the round went on to the workload SVIDs (refused too: the bucket is empty)
    for _ in range(5):  # within Retry-After (1 s): not asked again
        gpu1.maintain(bundle=False)
    assert REQUESTS.labels("POST", "/v1/nodes/renew", "429")._value.get() == node_429 + 1
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0, burst=1))  # limits off
    deadline = time.monotonic() + 10
    while gpu1.identity.svid == held and time.monotonic() < deadline:
        time.sleep(0.2)
        gpu1.maintain(bundle=False)
    renewed = gpu1.identity.svid
    assert renewed is not None and renewed != held and renewed.not_after >= held.not_after


def test_a_jwt_svid_fetch_refused_for_now_keeps_the_held_one_while_valid(served: Served, gpu1: Agent,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix: a JWT-SVID fetch refused for now (429 here) dropped the held JWT-SVID, though it was valid: the
    workload got PERMISSION_DENIED (no identity) from a rate-limited server. Now it is served while valid, then the
    Workload API's "retry" (RetryLater: UNAVAILABLE); a definitive refusal still drops it (by the X.509 rules)."""
    from agent.svids import RetryLater

    now = [time.time()]
    monkeypatch.setattr(gpu1.svids, "clock", lambda: now[0])
    workload, audience = "acme/train/f0", ["db"]
    held = gpu1.svids.jwt(workload, audience)
    assert held is not None and held.expires > held.issued
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0.001, burst=1))
    with pytest.raises(Refused):
        for _ in range(3):  # the node spends its bucket
            gpu1.api.placements()
    now[0] = held.issued + (held.expires - held.issued) * 0.6  # past half life: fetched again, and refused 429
    assert gpu1.svids.jwt(workload, audience) == held  # was None
    now[0] = held.expires + 1
    with pytest.raises(RetryLater):
        gpu1.svids.jwt(workload, audience)
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0, burst=1))  # limits off
    now[0] += RETRY_AFTER_MAX * 1.1 + 1  # (not asked again before the 429's Retry-After)
    fresh = gpu1.svids.jwt(workload, audience)
    assert fresh is not None and fresh.token != held.token


def test_a_jwt_svid_fetch_refused_for_now_is_not_asked_again_before_retry_after(
        served: Served, gpu1: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix (review3): a JWT-SVID fetch the server refused for now (429 with Retry-After, 5xx, no answer) was
    asked again at the workload's next ask (up to the agent's JWT bounds: 8 at once, then 1/s per workload), each
    under the agent's one lock: against a server that does not answer, each held it for the request's timeout, and a
    workload asking in a loop kept every other workload's Workload API calls waiting. Now, as for X.509-SVIDs, not
    asked again before the Retry-After (or a backoff); meanwhile the held one while valid, else UNAVAILABLE."""
    from agent.svids import RetryLater

    def jwt_answers(status: str) -> float:
        return float(REQUESTS.labels("POST", "/v1/svids/jwt", status)._value.get())

    now = [time.time()]
    monkeypatch.setattr(gpu1.svids, "clock", lambda: now[0])
    workload = "acme/train/f1"
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0.001, burst=1))
    with pytest.raises(Refused):
        for _ in range(3):  # the node spends its bucket
            gpu1.api.placements()
    limited = jwt_answers("429")
    for _ in range(5):
        with pytest.raises(RetryLater):
            gpu1.svids.jwt(workload, ["db"])
    assert jwt_answers("429") == limited + 1  # was + 5: asked at every call
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0, burst=1))  # limits off
    with pytest.raises(RetryLater):  # the Retry-After is not over
        gpu1.svids.jwt(workload, ["db"])
    now[0] += RETRY_AFTER_MAX * 1.1 + 1
    assert gpu1.svids.jwt(workload, ["db"]) is not None


def test_workloads_asking_jwt_svids_in_a_loop_cannot_get_their_node_rate_limited(
        served: Served, gpu1: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix (review): a workload picks its JWT-SVIDs' audience, and each new one was a request to the server,
    whose rate limit is the node's: a workload asking new audiences in a loop got its node 429s, which (transient)
    kept a revoked workload's X.509-SVID served and held back every renewal of the node, and the agent's cache of
    JWT-SVIDs grew without bound. Now the agent bounds what its workloads make it ask (per workload and per node):
    over the bound a workload gets UNAVAILABLE (retry), the server answers no 429, and the node's X.509 renewals
    go through at once."""
    from agent.svids import JWT_AUDIENCES, JWT_PER_NODE, JWT_PER_WORKLOAD, RetryLater

    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=50.0, burst=100))  # the default
    before = _held(gpu1)

    def jwt_answers(status: str) -> float:
        return float(REQUESTS.labels("POST", "/v1/svids/jwt", status)._value.get())

    issued, limited = jwt_answers("201"), jwt_answers("429")
    started = time.monotonic()
    unavailable = 0
    for i in range(150):  # each of the N workloads asks 150 new audiences, as fast as it can
        for name in NAMES:
            try:
                gpu1.svids.jwt(f"acme/train/{name}", [f"aud-{i}"])
            except RetryLater:
                unavailable += 1
    elapsed = time.monotonic() - started
    fetched = jwt_answers("201") - issued
    assert jwt_answers("429") == limited  # the server never had to refuse the node
    assert fetched <= min(N * (JWT_PER_WORKLOAD[1] + JWT_PER_WORKLOAD[0] * elapsed),
                          JWT_PER_NODE[1] + JWT_PER_NODE[0] * elapsed) + 1, (fetched, elapsed)
    assert unavailable == 150 * N - fetched
    assert all(len([k for k in gpu1.svids._jwt if k[0] == f"acme/train/{n}"]) <= JWT_AUDIENCES for n in NAMES)
    asked, answered = _batches(), _batches("200")
    gpu1.svids.renew_due()  # at once: one batch, answered
    assert _batches() == asked + 1 and _batches("200") == answered + 1
    renewed = _held(gpu1)
    assert all(renewed[i] != before[i] for i in IDS)


def test_a_long_retry_after_never_lets_the_node_svid_expire(served: Served, gpu1: Agent,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix (review): the node SVID's renewal waited out the server's Retry-After (up to 660 s) whatever the held
    SVID had left, so a long one could let it expire, and the node then needs a new join token. The wait is now at most
    half of what is left."""
    from datetime import datetime as real_datetime
    from datetime import timedelta

    import agent.runner as runner

    held = gpu1.identity.svid
    assert held is not None
    late = held.not_after - timedelta(seconds=100)  # 100 s of validity left: due, and a long Retry-After coming

    class Late(real_datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Late:
            return cls.fromtimestamp(late.timestamp(), tz)

    monkeypatch.setattr(runner, "datetime", Late)
    monkeypatch.setattr(served.env.app.state, "rate_limiter", TokenBucket(rate=0.002, burst=1))  # Retry-After ~500 s
    with pytest.raises(Refused):
        for _ in range(3):  # the node spends its bucket
            gpu1.api.placements()
    gpu1.maintain(bundle=False)
    assert gpu1.identity.svid == held
    assert 0 < gpu1._node_retry_at - time.monotonic() <= 50


def test_a_revoked_workload_is_still_dropped(served: Served, gpu1: Agent,  # last: it revokes two
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Last in this module: the revocations stay.

    Should fix (review3): a definitive refusal dropped only what it answered, the X.509-SVID, or the JWT-SVID of one
    audience; the workload's JWT-SVIDs for its other audiences stayed served (until half life, and, by the transient
    rules and the agent's JWT bounds, until their expiry) though the server had said the workload is revoked. Now a
    definitive refusal of either kind drops every JWT-SVID the workload holds. The JWT-SVIDs are asked with the
    agent's clock the server's (fresh: well before half life), the X.509 renewals with it past their half life."""
    before = _held(gpu1)
    shifted = gpu1.svids.clock
    monkeypatch.setattr(gpu1.svids, "clock", time.time)
    by_x509, by_jwt = NAMES[-1], NAMES[-2]
    victim, victim2 = (f"spiffe://example.org/tenant/acme/group/train/{n}" for n in (by_x509, by_jwt))
    jwts = {n: gpu1.svids.jwt(f"acme/train/{n}", ["db"]) for n in (NAMES[0], by_x509, by_jwt)}
    assert all(j is not None for j in jwts.values())
    for name in (by_x509, by_jwt):
        r = served.env.call("POST", f"/v1/tenants/acme/groups/train/workloads/{name}/revoke", "security",
                            json={"reason": "renewal failures test"})
        assert r.status_code == 200, r.text
    assert gpu1.svids.jwt(f"acme/train/{by_jwt}", ["other"]) is None  # 403 for another audience
    assert gpu1.svids.jwt(f"acme/train/{by_jwt}", ["db"]) is None  # was the held one: the workload is revoked
    monkeypatch.setattr(gpu1.svids, "clock", shifted)
    gpu1.svids.renew_due()
    monkeypatch.setattr(gpu1.svids, "clock", time.time)
    held = _held(gpu1)
    assert victim not in held and victim2 not in held  # 403: dropped at once
    assert set(held) == IDS - {victim, victim2} and all(held[i] != before[i] for i in held)
    assert set(serials(gpu1)) == IDS - {victim, victim2}
    assert gpu1.svids.jwt(f"acme/train/{by_x509}", ["db"]) is None  # was the held one: its X.509-SVID was refused
    assert not [k for k in gpu1.svids._jwt if k[0] in (f"acme/train/{by_x509}", f"acme/train/{by_jwt}")]
    assert gpu1.svids.jwt(f"acme/train/{NAMES[0]}", ["db"]) == jwts[NAMES[0]]  # another workload's: still held
