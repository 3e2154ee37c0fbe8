"""A trust domain with the golden fabric imported and the shipped policy active, on a real database, and the
reconciler over it with a clock the test moves: what the persistence tests of the enforcer start from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from audit import Actor
from audit.models import AuditEvent
from core.clock import FrozenClock
from enforcer import service
from enforcer.ir import DeviceRuleSet
from enforcer.reconcile import Reconciler
from keys.store import KeyKind
from pki.service import init_trust_domain
from policy import service as policy
from policy.grant_decider import RegoGrantDecider
from policy.grants import Caller, GrantRequest, approve_grant, request_grant
from tests.api.conftest import make_settings, open_context
from tests.enforcer.helpers import SMALL
from tests.policy.helpers import prepared_shipped
from workflows.context import AppContext
from workflows.enforcement import make_reconciler
from workflows.fabric import Who, import_fabric

TD = "example.org"
ADMIN = Actor("test-admin", "admin")


@dataclass
class Stack:
    ctx: AppContext
    clock: FrozenClock
    rec: Reconciler

    @property
    def who(self) -> Who:
        return Who(ADMIN, self.clock)

    def grant(self, src: str, dst: str, port: int | list[int], ttl: int = 3600) -> str:
        """A grant requested by src's tenant admin and approved by dst's: active (`port`: one, or several)."""
        st, sg = src.split("/")
        dt, dg = dst.split("/")
        decide = RegoGrantDecider()
        with self.ctx.db.session() as s:
            g, _ = request_grant(s, GrantRequest(st, sg, dt, dg, "tcp", [port] if isinstance(port, int) else port, ttl),
                                 caller=Caller(f"{st}-admin", "tenant-admin", st, Actor(f"{st}-admin", "tenant", st)),
                                 decide=decide, clock=self.clock)
        if g.state == "pending":
            with self.ctx.db.session() as s:
                g = approve_grant(s, g.id, caller=Caller(f"{dt}-admin", "tenant-admin", dt,
                                                         Actor(f"{dt}-admin", "tenant", dt)),
                                  clock=self.clock, decide=decide)
        assert g.state == "active", (g.state, g.reasons)
        return g.id

    def versions(self) -> dict[str, tuple[int, str | None]]:
        with self.ctx.db.read_session() as s:
            return {d: (st.version, st.content_hash) for d, st in service.states(s).items() if st.in_fabric}

    def desired(self, device: str) -> DeviceRuleSet:
        with self.ctx.db.read_session() as s:
            return service.ruleset_of(service.version_row(s, device))

    def events(self, action: str, since: int = 0) -> list[AuditEvent]:
        with self.ctx.db.read_session() as s:
            return list(s.exec(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.seq >= since)
                               .order_by(col(AuditEvent.seq))).all())

    def size(self) -> int:
        from audit import tree_size

        with self.ctx.db.read_session() as s:
            return tree_size(s)

    def close(self) -> None:
        self.rec.close()
        self.ctx.close()


def open_stack(home: Path, url: str | None = None, fabric: str | dict[str, Any] | None = None,
               **settings: Any) -> Stack:
    """`fabric`: what is imported (the golden small.yaml by default)."""
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    ctx = open_context(make_settings(home, url, **settings), clock)
    with ctx.db.session() as s:
        init_trust_domain(s, ctx.keystore, trust_domain=TD, key_kind=KeyKind.EC_P256, clock=clock)
    with ctx.db.session() as s:
        import_fabric(s, Who(ADMIN, clock), ctx.settings.pools(), SMALL.read_text() if fabric is None else fabric,
                      source="small.yaml")

    with ctx.db.session() as s:
        v, _ = policy.upload(s, prepared_shipped(), ADMIN, now=clock())
        policy.activate(s, v.number or 0, ADMIN, now=clock())
    return Stack(ctx, clock, make_reconciler(ctx))


def reasons(rs: DeviceRuleSet) -> set[str]:
    return {r for rule in rs.rules for r in rule.reasons}


def addresses(rs: DeviceRuleSet) -> set[str]:
    return {a for s in rs.sets for a in (*s.v4, *s.v6)}


def with_mode(stack: Stack, mode: str) -> Stack:
    stack.rec.config = replace(stack.rec.config, mode=mode)
    return stack
