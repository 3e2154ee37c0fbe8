"""Errors a person can act on: each error class carries its HTTP status (core base); an unmapped error is a
500 logged with the request id the answer names, never a 400; a dependency that is down is a 503; every
route module is mounted by name (a typo is an ImportError, not a missing router)."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

import api.routes
from api.app import ROUTERS, create_app
from core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    TrustfabricError,
    Unauthenticated,
    Unavailable,
)
from policy.errors import PolicyBudgetExceeded
from store.db import Database
from tests.api.conftest import Env, make_settings
from workflows.context import AppContext

PACKAGES = ("core", "store", "audit", "inventory", "pki", "policy", "workflows", "api", "pdp", "cli")


def _all_error_classes() -> set[type[TrustfabricError]]:
    for pkg in PACKAGES:
        module = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{pkg}."):
            importlib.import_module(info.name)
    found: set[type[TrustfabricError]] = set()
    todo: list[type[TrustfabricError]] = [TrustfabricError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] in PACKAGES and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_error_class_names_a_status_and_none_falls_back_to_500() -> None:
    classes = _all_error_classes()
    assert len(classes) > 30
    allowed = {400, 401, 403, 404, 409, 413, 422, 429, 503}
    upstream = {"ApiError"}  # the CLI's client: the server it asked failed (502)
    unmapped = sorted(c.__qualname__ for c in classes
                      if c.http_status not in allowed and not (c.__qualname__ in upstream and c.http_status == 502))
    assert unmapped == [], f"error classes without a status of their own (would be 500): {unmapped}"
    assert {InvalidInput.http_status, Unauthenticated.http_status, Forbidden.http_status, NotFound.http_status,
            Conflict.http_status, PayloadTooLarge.http_status, RateLimited.http_status,
            Unavailable.http_status, PolicyBudgetExceeded.http_status} == allowed
    assert TrustfabricError.http_status == 500


class Unmapped(TrustfabricError):
    """An error class someone forgot to give a status."""


def _app_raising(env: Env, exc: Exception) -> TestClient:
    router = APIRouter()

    @router.get("/boom")
    def boom() -> dict[str, Any]:
        raise exc

    return TestClient(create_app(env.ctx, extra_routers=[router]), raise_server_exceptions=False)


def test_an_unmapped_error_is_a_500_logged_under_the_request_id(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    client = _app_raising(env, Unmapped("the disk is full"))
    with caplog.at_level(logging.ERROR, logger="trustfabric.api"):
        r = client.get("/boom", headers={"X-Request-ID": "req-42"})
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "internal_error" and body["request_id"] == "req-42" and "req-42" in body["reason"]
    assert "disk" not in r.text  # the details stay in the log
    logged = [rec for rec in caplog.records if "req-42" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None and "the disk is full" in str(logged[0].exc_info[1])

    r = _app_raising(env, KeyError("x")).get("/boom")
    assert r.status_code == 500 and r.json()["request_id"] == r.headers["X-Request-ID"]


def test_an_unavailable_dependency_is_a_503_naming_it(env: Env) -> None:
    r = _app_raising(env, Unavailable("the OPA server at http://127.0.0.1:9 is unreachable")).get("/boom")
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert r.json() == {"error": "unavailable", "reason": "the OPA server at http://127.0.0.1:9 is unreachable"}


def test_a_database_that_cannot_be_opened_is_a_503(tmp_path: Path, env: Env) -> None:
    missing = tmp_path / "no-such-dir" / "trustfabric.db"
    ctx = AppContext(settings=make_settings(tmp_path / "home"), db=Database(f"sqlite:///{missing}"),
                     keystore=env.ctx.keystore)
    try:
        r = TestClient(create_app(ctx), raise_server_exceptions=False).get("/healthz")
    finally:
        ctx.close()
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "unavailable" and "database" in r.json()["reason"]


def test_every_route_module_is_mounted() -> None:
    modules = {m.name for m in pkgutil.iter_modules(api.routes.__path__) if m.name != "common"}
    routers = {name: importlib.import_module(f"api.routes.{name}").router for name in modules}
    assert [name for name, router in sorted(routers.items()) if router not in ROUTERS] == []
    assert len(ROUTERS) == len(modules)


@pytest.mark.parametrize("force", ["yes", "true", 1, "on"])
def test_a_flag_that_acts_is_a_json_boolean_only(env: Env, force: Any) -> None:
    """POST /v1/ca/rotate {"force": "yes"} rotated the CAs at once (pydantic's lax mode reads "yes", "on", "1" and
    1 as true): a body flag that changes state takes JSON true/false only; anything else is a 422, nothing done."""
    before = env.call("GET", "/v1/ca/status", "admin").json()
    r = env.call("POST", "/v1/ca/rotate", "admin", json={"force": force})
    assert r.status_code == 422 and "force" in r.json()["reason"], r.text
    assert env.call("GET", "/v1/ca/status", "admin").json() == before
    r = env.call("POST", "/v1/audit/exports", "admin", json={"format": "jsonl", "include_decisions": "yes"})
    assert r.status_code == 422 and "include_decisions" in r.json()["reason"], r.text
