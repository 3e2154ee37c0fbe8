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


def test_a_tenant_paging_either_way_sees_its_own_events_only(env: Env) -> None:
    """order=desc and after=SEQ keep the tenant scope the cursor kept: acme paging backwards from past the newest
    event (globex's, interleaved) sees acme's events only, every one once, and its last page says no more follow
    although globex's older events do (a regression guard: this held when reviewed)."""
    for slug in ("acme", "globex"):
        if env.call("GET", f"/v1/tenants/{slug}", "admin").status_code == 404:
            made = env.call("POST", "/v1/tenants", "admin", json={"slug": slug, "display_name": slug.title()})
            assert made.status_code == 201
    for n in range(3):
        for slug in ("acme", "globex"):
            body = {"name": f"g{n}", "ports": [{"proto": "tcp", "port": 443}]}
            assert env.call("POST", f"/v1/tenants/{slug}/groups", "admin", json=body).status_code == 201
    env.headers("tenant-admin", "acme")  # its token made (and audited, acme's) before the log is read
    every = env.call("GET", "/v1/audit/events?limit=1000", "auditor").json()["items"]
    mine = [e["seq"] for e in every if e["tenant"] == "acme"]
    assert len(mine) >= 4 and any(e["tenant"] == "globex" for e in every)
    for order, start in (("desc", every[-1]["seq"] + 1), ("asc", 0)):
        seen: list[int] = []
        after = start
        while True:
            page = env.call("GET", f"/v1/audit/events?order={order}&limit=2&after={after}", "tenant-admin",
                            "acme").json()
            assert {e["tenant"] for e in page["items"]} <= {"acme"}, page
            seen.extend(e["seq"] for e in page["items"])
            if page["next_cursor"] is None:
                break
            after = seen[-1]
        expected = sorted(mine, reverse=True) if order == "desc" else [s for s in mine if s > 0]
        assert seen == expected, (order, seen, expected)
    other = env.call("GET", "/v1/audit/events?tenant=globex&order=desc", "tenant-admin", "acme")
    assert other.status_code == 403
