"""/docs can authenticate: the OpenAPI document declares the bearer scheme (and mTLS), and every operation that
refuses an anonymous caller says so, so Swagger UI shows an Authorize button and sends the token on "Try it out".
Enumerated from the document and checked against what the API does: an operation marked `security` answers an
anonymous request 401; one not marked is in PUBLIC and does not."""

from __future__ import annotations

import re

from tests.api.conftest import Env

PUBLIC = {"GET /healthz", "GET /readyz", "GET /v1/bundle", "GET /v1/crl", "POST /v1/nodes/attest"}
PLACEHOLDER = "0a0a0a0a"  # a path parameter's value that every pattern here accepts or refuses after auth


def _operations(document: dict[str, object]) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for path, item in document["paths"].items():  # type: ignore[attr-defined]
        for method, operation in item.items():
            found[f"{method.upper()} {path}"] = operation
    return found


def test_the_document_declares_how_to_authenticate(env: Env) -> None:
    document = env.client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["mtls"]["type"] == "mutualTLS"


def test_every_protected_operation_names_the_scheme_and_no_public_one_does(env: Env) -> None:
    operations = _operations(env.client.get("/openapi.json").json())
    unmarked = {name for name, op in operations.items() if "security" not in op}
    assert unmarked == PUBLIC & set(operations)
    assert len(operations) - len(unmarked) > 60
    for name, operation in operations.items():
        if name in unmarked:
            continue
        assert {"bearer": []} in operation["security"], name  # type: ignore[operator]
        method, path = name.split(" ", 1)
        url = re.sub(r"\{[^}]+\}", PLACEHOLDER, path)
        answer = env.client.request(method, url, json={} if method in {"POST", "PUT", "PATCH"} else None)
        assert answer.status_code == 401, (name, answer.status_code, answer.text)


def test_public_operations_answer_without_credentials(env: Env) -> None:
    for name in PUBLIC & set(_operations(env.client.get("/openapi.json").json())):
        method, path = name.split(" ", 1)
        answer = env.client.request(method, path, json={} if method == "POST" else None)
        assert answer.status_code != 401, (name, answer.text)
