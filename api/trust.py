"""The trust domain in force: what `init` stored (pki settings), else the configured one."""

from __future__ import annotations

from sqlmodel import Session

from api.context import AppContext


def trust_domain(ctx: AppContext, session: Session) -> str:
    from pki.models import TrustDomainSettings

    row = session.get(TrustDomainSettings, 1)
    return row.trust_domain if row is not None else ctx.settings.trust_domain
