"""Issue 13, item 8: a quarantined tenant (or group) gets no X.509- or JWT-SVID and registers no workload:
403 with the reason, nothing issued or written, and the refusal in the asking principal's decision log
(kind authz, where denials are logged). Lifting the quarantine restores issuance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, func, select

from audit.models import AuditEvent
from pki.models import IssuedSvid
from policy.models import DecisionRecord
from tests.api.conftest import BOTH_DATABASES, Env, database_for, seeded_env
from tests.pki.helpers import make_csr


@pytest.fixture(params=BOTH_DATABASES)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    with seeded_env(tmp_path / "home", database_for(request)) as e:
        for role, tenant in (("security", None), ("tenant-admin", "acme"), ("tenant-admin", "globex")):
            e.headers(role, tenant)  # minted up front: minting writes audit events of its own
        yield e


def _counts(env: Env) -> tuple[int, int]:
    with env.ctx.db.read_session() as s:
        return (int(s.exec(select(func.count()).select_from(IssuedSvid)).one()),
                int(s.exec(select(func.count()).select_from(AuditEvent)).one()))


def _issue(env: Env, new_workload: str) -> tuple[Any, Any, Any]:
    x509 = env.call("POST", "/v1/svids/x509", "tenant-admin", "acme",
                    json={"csr": make_csr().decode(), "tenant": "acme", "group": "web", "workload": "web-1"})
    jwt = env.call("POST", "/v1/svids/jwt", "tenant-admin", "acme",
                   json={"tenant": "acme", "group": "web", "workload": "web-1", "audience": ["db"]})
    reg = env.call("POST", "/v1/tenants/acme/groups/web/workloads", "tenant-admin", "acme",
                   json={"name": new_workload})
    return x509, jwt, reg


def test_a_quarantined_tenant_or_group_gets_no_identity_and_registers_no_workload(env: Env) -> None:
    """Item 8: fails on the code before the fix (issuance and registration went through: 201)."""
    for target in ("tenant", "group"):
        path = "/v1/tenants/acme/quarantine" if target == "tenant" else "/v1/tenants/acme/groups/web/quarantine"
        assert env.call("POST", path, "security", json={"reason": "incident INC-7"}).status_code == 200
        before = _counts(env)
        for r in _issue(env, "web-2"):
            assert r.status_code == 403, r.text
            assert r.json()["error"] == "quarantined"
            what = "tenant acme" if target == "tenant" else "group acme/web"
            assert f"{what} is quarantined" in r.json()["reason"]
        assert _counts(env) == before  # nothing issued, no audit event without its change
        with env.ctx.db.read_session() as s:
            denials = s.exec(select(DecisionRecord).where(DecisionRecord.kind == "authz")
                             .order_by(col(DecisionRecord.id))).all()[-3:]
        assert [(d.tenant, d.allowed, d.input["action"]) for d in denials] == [
            ("acme", False, "svid.issue"), ("acme", False, "svid.issue"), ("acme", False, "workload.register")]
        assert all(d.reasons[0].startswith("quarantined: ") for d in denials)
        assert {d.input["resource"]["kind"] for d in denials[:2]} == {"x509", "jwt"}
        # another tenant is not affected
        r = env.call("POST", "/v1/svids/jwt", "tenant-admin", "globex",
                     json={"tenant": "globex", "group": "api", "workload": "api-1", "audience": ["db"]})
        assert r.status_code == 201, r.text
        lift = path.replace("/quarantine", "/unquarantine")
        assert env.call("POST", lift, "security", json={"reason": "resolved"}).status_code == 200
        assert [r.status_code for r in _issue(env, f"web-{target}")] == [201, 201, 201]
