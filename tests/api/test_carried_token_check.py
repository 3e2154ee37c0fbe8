"""POST /v1/grants on PostgreSQL reads its API token's row in the decision marker's statement (store/carried.py), not
in a round trip of its own (issue 11). What must not change: a token revoked (anywhere: here another connection, as
another replica) is refused from the next request on, with 401 before any other answer the request would get, and
nothing is written or returned on it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest
from sqlmodel import func, select

from audit.models import AuditEvent
from policy.models import DecisionRecord, Grant
from tests.api.conftest import Env, seeded_env
from tests.roundtrips import watch

pytestmark = pytest.mark.postgres

REQ = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
       "ttl_seconds": 3600, "justification": "carried"}


@pytest.fixture
def pg(postgres_server: Any, tmp_path: Path) -> Iterator[tuple[Env, str]]:
    url = postgres_server.create_database()
    with seeded_env(tmp_path / "home", url, quota_grants=0, quota_pending=0) as e:
        yield e, url


def _counts(env: Env) -> tuple[int, int, int]:
    with env.ctx.db.read_session() as s:
        return tuple(int(s.exec(select(func.count()).select_from(t)).one())  # type: ignore[return-value]
                     for t in (Grant, AuditEvent, DecisionRecord))


def _elsewhere(url: str, sql: str, *params: Any) -> None:
    """A change committed on a connection of its own, as another replica's."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql, params)


def _post(env: Env, token: str, body: dict[str, Any] = REQ, /, **headers: str) -> Any:
    return env.client.post("/v1/grants", json=body, headers={"Authorization": f"Bearer {token}", **headers})


def test_the_token_row_rides_in_the_marker_statement(pg: tuple[Env, str]) -> None:
    env, _url = pg
    token = env.token("tenant-admin", "acme")
    for _ in range(2):  # warm: the decider's document, the signature cache
        assert _post(env, token).status_code == 201
    with watch(env.ctx.db.engine) as sent:
        sent.next_round()
        assert _post(env, token).status_code == 201
    alone = [s for s in sent.rounds[-1] if str(s).lstrip().startswith("SELECT token_hash")]
    assert not alone, alone  # what issued_row reads, in a statement of its own, on a request not carrying it
    r = env.client.get("/v1/grants", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200  # (a route that does not carry the check reads the row as before)


@pytest.mark.parametrize("change, reason", [
    ("UPDATE api_tokens SET revoked_at = now() WHERE id = %s", "token revoked"),
    ("UPDATE api_tokens SET expires_at = %s WHERE id = %s", "token expired"),  # a second before the app's now
    ("UPDATE api_tokens SET role = 'tenant-member' WHERE id = %s", "do not match"),
    ("DELETE FROM api_tokens WHERE id = %s", "unknown to this server"),
], ids=["revoked", "row-expired", "role-changed", "row-gone"])
def test_a_token_refused_elsewhere_is_refused_at_once_and_nothing_is_written(
        pg: tuple[Env, str], change: str, reason: str) -> None:
    env, url = pg
    token = env.token("tenant-admin", "acme")
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    first = _post(env, token, **{"Idempotency-Key": "carried-1"})
    assert first.status_code == 201, first.text
    before = _counts(env)
    if change.startswith("UPDATE api_tokens SET expires_at"):
        _elsewhere(url, change, env.clock() - timedelta(seconds=1), jti)
    else:
        _elsewhere(url, change, jti)
    cases = [
        ({}, REQ),  # a new grant
        ({"Idempotency-Key": "carried-1"}, REQ),  # the retry of the first: its grant is not handed out
        ({}, {**REQ, "src_tenant": "globex"}),  # another tenant's groups: 403 for a good token
        ({}, {**REQ, "ttl_seconds": 30 * 86400}),  # above the maximum TTL: 400 for a good token
        ({"Idempotency-Key": "carried-1"}, {**REQ, "justification": "other"}),  # the key's conflict: 409
    ]
    for headers, body in cases:
        r = _post(env, token, body, **headers)
        assert r.status_code == 401, (headers, body, r.status_code, r.text)
        assert reason in r.json()["reason"], r.json()
    assert _counts(env) == before


def test_a_good_token_keeps_its_answers(pg: tuple[Env, str]) -> None:
    """The refusals the request itself makes are unchanged for a token that is in order."""
    env, _url = pg
    token = env.token("tenant-admin", "acme")
    assert _post(env, token, **{"Idempotency-Key": "k1"}).status_code == 201
    again = _post(env, token, **{"Idempotency-Key": "k1"})
    assert again.status_code == 200
    assert _post(env, token, {**REQ, "justification": "x"}, **{"Idempotency-Key": "k1"}).status_code == 409
    assert _post(env, token, {**REQ, "src_tenant": "globex"}).status_code == 403
    assert _post(env, token, {**REQ, "ttl_seconds": 30 * 86400}).status_code == 400
    expiring = env.token("tenant-admin", "acme", ttl=timedelta(minutes=5))
    assert _post(env, expiring).status_code == 201
    env.clock.advance(timedelta(minutes=6))
    r = _post(env, expiring)
    assert r.status_code == 401 and "expired" in r.json()["reason"]


def test_a_revoked_tokens_requests_never_drain_the_bucket_of_the_principal_it_names(postgres_server: Any,
                                                                                   tmp_path: Path) -> None:
    """The principal is charged its rate-limit token before its row is read (in the request's first statement);
    when the row then refuses, the charge goes back: a leaked and revoked token, replayed, must not lock the
    principal it names out of every route (found in review: six 401s, then the principal's good token got 429)."""
    url = postgres_server.create_database()
    with seeded_env(tmp_path / "home", url, quota_grants=0, quota_pending=0, rate_limit_per_second=0.001,
                    rate_limit_burst=5) as env:
        bad = env.token("tenant-admin", "acme", subject="alice")
        good = env.token("tenant-admin", "acme", subject="alice")
        _elsewhere(url, "UPDATE api_tokens SET revoked_at = now() WHERE id = %s",
                   jwt.decode(bad, options={"verify_signature": False})["jti"])
        assert [_post(env, bad).status_code for _ in range(6)] == [401] * 6
        assert [_post(env, good).status_code for _ in range(5)] == [201] * 5  # the whole burst is the principal's
        assert _post(env, good).status_code == 429  # and the limit still holds
