"""Security workflows: revoking a workload's identity (pki + inventory + audit in one transaction) and
quarantine; a request that changes nothing is a conflict and writes nothing."""

from __future__ import annotations

import pytest
from sqlmodel import col, select

from audit import Actor
from audit.models import AuditEvent
from core.errors import Conflict
from inventory import service as inv
from inventory.errors import WorkloadNotFound
from pki.models import IssuedSvid
from pki.service import issue_jwt_svid, issue_x509_svid
from tests.pki.helpers import make_csr
from workflows import security
from workflows.context import AppContext
from workflows.init import initialize

ACTOR = Actor("sec-1", "security")


def _seed(ctx: AppContext) -> str:
    initialize(ctx, "example.org", "ec-p256")
    with ctx.db.session() as s:
        inv.create_tenant(s, slug="acme", display_name="Acme", actor=ACTOR, clock=ctx.clock)
        inv.create_group(s, tenant="acme", name="web", actor=ACTOR, clock=ctx.clock)
        inv.register_workload(s, trust_domain="example.org", tenant="acme", group="web", name="w1", actor=ACTOR,
                              clock=ctx.clock)
        issued = issue_x509_svid(s, ctx.keystore, csr_pem=make_csr(), tenant="acme", group="web", workload="w1",
                                 ttl=None, actor=ACTOR, scope_tenant=None, clock=ctx.clock)
        issue_jwt_svid(s, ctx.keystore, tenant="acme", group="web", workload="w1", audience=["a"], ttl=None,
                       actor=ACTOR, scope_tenant=None, clock=ctx.clock)
    return issued.serial


def _actions(ctx: AppContext) -> list[str]:
    with ctx.db.read_session() as s:
        return [e.action for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]


def test_revoking_a_workload_revokes_its_svids_and_marks_it(ctx: AppContext) -> None:
    serial = _seed(ctx)
    before = _actions(ctx)
    with ctx.db.session() as s:
        workload, serials = security.revoke_workload(
            s, tenant="acme", group="web", name="w1", reason="compromised", actor=ACTOR, scope_tenant=None,
            clock=ctx.clock, request_id="r-1",
        )
    assert workload.revoked and serials == [serial]
    with ctx.db.read_session() as s:
        assert s.get(IssuedSvid, serial).revoked_at is not None  # type: ignore[union-attr]
        assert inv.get_workload(s, "acme", "web", "w1").revoked
    added = _actions(ctx)[len(before):]
    assert added == ["identity.revoke", "workload.revoke"]
    with pytest.raises(Conflict, match="already revoked"), ctx.db.session() as s:
        security.revoke_workload(s, tenant="acme", group="web", name="w1", reason="again", actor=ACTOR,
                                 scope_tenant=None, clock=ctx.clock)
    with pytest.raises(WorkloadNotFound), ctx.db.session() as s:
        security.revoke_workload(s, tenant="acme", group="web", name="ghost", reason="x", actor=ACTOR,
                                 scope_tenant=None, clock=ctx.clock)
    assert _actions(ctx)[len(before):] == added  # the refused ones wrote nothing


def test_quarantine_once_then_conflict(ctx: AppContext) -> None:
    _seed(ctx)
    with ctx.db.session() as s:
        tenant = security.set_quarantine(s, tenant="acme", group=None, quarantined=True, actor=ACTOR, reason="inc")
    assert tenant.quarantined
    count = len(_actions(ctx))
    with pytest.raises(Conflict), ctx.db.session() as s:
        security.set_quarantine(s, tenant="acme", group=None, quarantined=True, actor=ACTOR, reason="inc")
    assert len(_actions(ctx)) == count
