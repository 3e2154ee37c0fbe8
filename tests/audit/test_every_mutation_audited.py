"""No change without its audit event, no audit event without its change -- over every mutating route.

schemathesis generates requests for every POST/PUT/PATCH/DELETE operation of the live OpenAPI document
(as a platform admin and as a tenant admin). Each request carries its own X-Request-ID. Afterwards:
a 2xx answer wrote at least one audit event and every event it wrote names that request id; any other
answer wrote no audit event at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok
from sqlmodel import col, func, select

from audit import checkpoint as cpm
from audit.models import AuditEvent
from tests.api.conftest import Env, make_settings, open_env, seed

pytestmark = pytest.mark.xdist_group("audit-mutations")
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
MAX_EXAMPLES = 12
# 2xx without a change is right for these: reads in POST clothing, and schedules that may find nothing due.
NO_CHANGE_OK = {
    "POST /v1/policy/validate",
    "POST /v1/policy/test",
    "POST /v1/policy/impact",
    "POST /v1/policy/explain",
    "POST /v1/decisions",
    "POST /v1/policy/query",
    "POST /v1/ca/rotate",  # runs the rotation schedule; with nothing due it changes nothing
    "POST /v1/fabric/import",  # importing what is stored already is idempotent: nothing changes, nothing is written
    # a report that changes only counters stores them without an event; a changed applied version or drift
    # state is audited (tests/enforcer/test_device_api.py shows both)
    "POST /v1/devices/{device}/status",
}
# Batches answered per entry (200 even when every entry was refused): exactly one event per entry issued.
PER_ENTRY = {"POST /v1/svids/x509/batch": "svid.issue"}
# (operation, status) answers that mean "nothing changed": a retry with a used Idempotency-Key.
NO_CHANGE_STATUS = {("POST /v1/grants", 200)}


@pytest.fixture(scope="module")
def mut_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = open_env(make_settings(Path(tmp_path_factory.mktemp("mutations")) / "home"))
    cpm.ensure_audit_key(env.ctx.keystore)
    seed(env)
    yield env
    env.client.close()
    env.ctx.close()


def _events_since(env: Env, seq: int) -> list[AuditEvent]:
    with env.ctx.db.read_session() as s:
        return list(s.exec(select(AuditEvent).where(AuditEvent.seq >= seq).order_by(col(AuditEvent.seq))).all())


def _size(env: Env) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(AuditEvent)).one())


def _runner(env: Env, headers: dict[str, str], operation: Any, problems: list[str]) -> Callable[[], None]:
    label = operation.label

    @given(case=operation.as_strategy())
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: schemathesis.Case[Any]) -> None:
        rid = "mut-" + uuid.uuid4().hex[:16]
        before = _size(env)
        response = case.call(headers={**headers, "X-Request-ID": rid})
        written = _events_since(env, before)
        status = response.status_code
        if 200 <= status < 300 and label in PER_ENTRY:
            issued = sum(1 for result in response.json()["results"] if result.get("svid"))
            actions = [e.action for e in written]
            if actions != [PER_ENTRY[label]] * issued:
                problems.append(f"{label} -> {status} issued {issued} entries but wrote {actions}")
            if any(e.request_id != rid for e in written):
                problems.append(f"{label} -> {status} wrote events without its request id")
        elif 200 <= status < 300:
            if label not in NO_CHANGE_OK and (label, status) not in NO_CHANGE_STATUS and not written:
                problems.append(f"{label} -> {status} but wrote no audit event")
            stray = [e.action for e in written if e.request_id != rid]
            if stray:
                problems.append(f"{label} -> {status} wrote events without its request id: {stray}")
        elif written:
            problems.append(f"{label} -> {status} (failed) but wrote {[e.action for e in written]}")

    return run


def _walk(env: Env, headers: dict[str, str]) -> tuple[list[str], list[str]]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", env.app)
    walked: list[str] = []
    problems: list[str] = []
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise result.err()  # the document has an operation schemathesis cannot read
        operation = result.ok()
        if operation.method.upper() in MUTATING:
            _runner(env, headers, operation, problems)()
            walked.append(operation.label)
    return walked, problems


def test_every_mutating_route_writes_exactly_its_events(mut_env: Env) -> None:
    admin = mut_env.headers("admin")
    tenant = mut_env.headers("tenant-admin", "acme")
    walked, problems = _walk(mut_env, admin)
    _walked_t, problems_t = _walk(mut_env, tenant)
    assert "POST /v1/audit/exports" in walked and len(walked) >= 10
    found = sorted(set(problems + problems_t))
    assert not found, "\n".join(found)
