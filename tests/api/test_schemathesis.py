"""schemathesis over the whole OpenAPI document, as authenticated principals (a platform admin and a
tenant admin): no 5xx, and every response matches the schema (status, content type, body)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import Env, seeded_env

pytestmark = pytest.mark.xdist_group("schemathesis")

# 15 cases an operation, the same ones every run (derandomize): a failure reproduces, and the two roles' runs
# (about 45 operations each) stay ~10 s on a quiet 2-core machine; 30 random cases took twice that.
MAX_EXAMPLES = 15
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with seeded_env(Path(tmp_path_factory.mktemp("fuzz")) / "home") as env:
        yield env


def fuzz(env: Env, headers: dict[str, str]) -> list[str]:
    """Every operation of the live OpenAPI document, MAX_EXAMPLES generated cases each; fails with the
    list of every operation that produced a 5xx or a response outside its schema."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", env.app)
    done: list[str] = []
    failures: list[str] = []
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise result.err()  # the document has an operation schemathesis cannot read
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)
        def run(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises a FailureGroup
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
        done.append(operation.label)
    assert not failures, "\n\n".join(failures)
    return done


def test_as_admin(fuzz_env: Env) -> None:
    done = fuzz(fuzz_env, fuzz_env.headers("admin"))
    assert "POST /v1/grants" in done and len(done) >= 30


def test_as_tenant_admin(fuzz_env: Env) -> None:
    done = fuzz(fuzz_env, fuzz_env.headers("tenant-admin", "acme"))
    assert "GET /v1/tenants/{tenant}/groups" in done
