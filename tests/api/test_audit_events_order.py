"""GET /v1/audit/events pages both ways: order=desc is newest first, its cursor goes on to older events, and
`after` is the cursor in the open (a sequence number), given instead of the cursor, never with it."""

from __future__ import annotations

from tests.api.conftest import Env


def _seqs(page: dict[str, list[dict[str, int]]]) -> list[int]:
    return [e["seq"] for e in page["items"]]


def test_newest_first_pages_to_older_events(env: Env) -> None:
    for n in range(5):
        assert env.call("POST", "/v1/tenants", "admin", json={"slug": f"t{n}", "display_name": "T"}).status_code == 201
    whole = _seqs(env.call("GET", "/v1/audit/events?limit=1000", "auditor").json())
    first = env.call("GET", "/v1/audit/events?order=desc&limit=2", "auditor").json()
    assert _seqs(first) == sorted(whole, reverse=True)[:2]
    by_cursor = env.call("GET", f"/v1/audit/events?order=desc&limit=2&cursor={first['next_cursor']}", "auditor")
    by_after = env.call("GET", f"/v1/audit/events?order=desc&limit=2&after={_seqs(first)[-1]}", "auditor")
    assert _seqs(by_cursor.json()) == _seqs(by_after.json()) == sorted(whole, reverse=True)[2:4]
    ascending = env.call("GET", f"/v1/audit/events?limit=2&after={whole[1]}", "auditor").json()
    assert _seqs(ascending) == whole[2:4]


def test_cursor_and_after_together_are_refused(env: Env) -> None:
    first = env.call("GET", "/v1/audit/events?limit=1", "auditor").json()
    answer = env.call("GET", f"/v1/audit/events?limit=1&after=1&cursor={first['next_cursor']}", "auditor")
    assert answer.status_code in {400, 422} and "either cursor or after" in answer.json()["reason"]
    answer = env.call("GET", "/v1/audit/events?order=sideways", "auditor")
    assert answer.status_code == 422
