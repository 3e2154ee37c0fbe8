"""`/` is not a 404: a browser (Accept: text/html) is sent on to the console (303), any other client gets a small
JSON index of where the API, its documentation and the console are; neither needs a credential."""

from __future__ import annotations

from tests.api.conftest import Env

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_browser_is_sent_to_the_console(env: Env) -> None:
    answer = env.client.get("/", headers={"Accept": BROWSER_ACCEPT}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/"
    assert env.client.get(answer.headers["location"], headers={"Accept": BROWSER_ACCEPT}).status_code == 200


def test_any_other_client_gets_the_index(env: Env) -> None:
    for accept in ("*/*", "application/json"):
        answer = env.client.get("/", headers={"Accept": accept}, follow_redirects=False)
        assert answer.status_code == 200
        index = answer.json()
        assert index == {**index, "api": "/v1", "docs": "/docs", "console": "/console/"}
    for path in {index["docs"], index["openapi"]}:
        assert env.client.get(path).status_code == 200
