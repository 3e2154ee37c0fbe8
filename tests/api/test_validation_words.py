"""A refused value says what the field must be in words, with the field's path: `GET /v1/tenants/NoSuch` is
"path.tenant: tenant must be 1-63 lowercase letters, ...", never pydantic's
"String should match pattern '^[a-z0-9]...'".
Every pattern the OpenAPI document declares has its words (api/patterns.py), so a new one cannot escape."""

from __future__ import annotations

from typing import Any

from api.patterns import PATTERN_WORDS
from tests.api.conftest import Env

LABEL = "1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"


def _patterns(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        return found.union(*(_patterns(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_patterns(v) for v in node))
    return set()


def test_a_path_parameter_refused_by_its_pattern_is_explained_in_words(env: Env) -> None:
    answer = env.call("GET", "/v1/tenants/NoSuch", "admin")
    assert answer.status_code == 422
    body = answer.json()
    assert body["reason"] == f"path.tenant: tenant must be {LABEL}"
    assert body["problems"] == [{"loc": ["path", "tenant"], "msg": f"tenant must be {LABEL}"}]
    assert "pattern" not in answer.text


def test_a_body_field_refused_by_its_pattern_is_explained_in_words(env: Env) -> None:
    answer = env.call("POST", "/v1/tenants", "admin", json={"slug": "Bad_Name", "display_name": "Bad"})
    assert answer.status_code == 422
    assert answer.json()["reason"] == f"body.slug: slug must be {LABEL}"
    answer = env.call("POST", "/v1/svids/revoke", "admin", json={"serial": "zz", "reason": "test"})
    assert answer.status_code == 422
    assert answer.json()["reason"].startswith("body.serial: serial must be a certificate serial number in hex")


def test_other_problems_keep_their_own_message(env: Env) -> None:
    answer = env.call("GET", "/v1/tenants/" + "a" * 64, "admin")
    assert answer.status_code == 422
    assert answer.json()["reason"] == "path.tenant: String should have at most 63 characters"


def test_every_pattern_of_the_api_has_its_words(env: Env) -> None:
    declared = _patterns(env.client.get("/openapi.json").json())
    assert declared, "the document declares no pattern: the walk is wrong"
    assert declared - set(PATTERN_WORDS) == set()
