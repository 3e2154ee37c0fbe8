"""How many statements a grant request sends to the database (issue 11): each round trip costs the database
~50 us of CPU and this process far more in SQLAlchemy and the driver, on a path that must stay cheap. Counted
where the driver sends them (tests/roundtrips.py), for the request alone (the app here runs no reconciler)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import BOTH_DATABASES, Env, database_for, seeded_env
from tests.roundtrips import listing, watch

REQ = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
       "ttl_seconds": 3600, "justification": "round trips"}
# The figures once the decision's reads are warm (the decider's document kept, the token's row cached on SQLite).
MAX_STATEMENTS = {"postgresql": 6, "sqlite": 13}


@pytest.fixture(params=BOTH_DATABASES)
def env_bench(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """As bench/replicas.py runs the server: no quota (a quota's check adds its lock and count)."""
    with seeded_env(tmp_path / "home", database_for(request), quota_grants=0, quota_pending=0) as e:
        yield e


def _grant(env: Env, headers: dict[str, str]) -> Any:
    r = env.client.post("/v1/grants", json=REQ, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "idempotency-key"])
def test_a_grant_request_sends_at_most_its_budget_of_statements(env_bench: Env, keyed: bool) -> None:
    """With an Idempotency-Key (each request its own, as clients retrying send them) the same budget: the lookup of
    an earlier grant under the key is read in the decision marker's statement, not in one of its own."""
    env = env_bench
    headers = env.headers("tenant-admin", "acme")
    engine = env.ctx.db.engine
    with watch(engine) as sent:
        for i in range(5):  # the first two warm up the decider's document and the pool's traced connections
            sent.next_round()
            assert _grant(env, {**headers, "Idempotency-Key": f"round-trips-{i}"} if keyed else headers
                          )["state"] == "pending"
    worst = max(sent.rounds[3:], key=len)
    budget = MAX_STATEMENTS[engine.dialect.name]
    assert len(worst) <= budget, f"{len(worst)} statements (budget {budget}):\n{listing(worst)}"
