"""What a tenant may learn about another tenant's inventory from decision reasons (issue 13, item 9).

The rule: a tenant learns about a group of another tenant no more than its own grants show. A grant the
policy did not deny (pending, active, expired, revoked, rejected), where the tenant is source or
destination, shows that the group exists and accepted a request; nothing else does. So when a tenant
principal asks about a flow or requests a grant whose other side is a group of another tenant (not the
platform, whose services are offered to every tenant), holds no such grant naming that group, and the
answer is a denial, then every reason that names the other tenant is dropped and one reason that is true
in every case is added: the same answer whether the group exists, exposes the port, is quarantined or is
revoked. Reasons about the request's shape and the asking tenant's own side stay. Platform principals
(admin, security, auditor) and decisions that allow are answered in full; the true reasons of a redacted
denial go to the server log (policy.decide logs every denial), never to the tenant.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from sqlalchemy import and_, or_
from sqlmodel import Session, col, select

from core.vocabulary import PLATFORM_TENANT
from policy.models import Grant


@lru_cache(maxsize=1024)
def _mention(tenant: str) -> re.Pattern[str]:
    t = re.escape(tenant)
    # `t/group`, `/tenant/t/` (SPIFFE IDs) and `tenant t` as the shipped policies word them; a slug never
    # matches inside a longer one (`me/` is not in `acme/`)
    return re.compile(rf"(?<![a-z0-9-]){t}/|\btenant {t}(?![a-z0-9-])")


def mentions(reason: str, tenant: str) -> bool:
    """Whether `reason` names `tenant` (as `tenant/group`, a SPIFFE ID under it, or `tenant <t>`)."""
    return _mention(tenant).search(reason) is not None


def knows_group(session: Session, viewer: str, tenant: str, group: str) -> bool:
    """Whether `viewer` holds a grant the policy did not deny between one of its groups and tenant/group."""
    found = session.exec(
        select(Grant.id).where(
            col(Grant.state) != "denied",
            or_(
                and_(col(Grant.src_tenant) == viewer, col(Grant.dst_tenant) == tenant, col(Grant.dst_group) == group),
                and_(col(Grant.dst_tenant) == viewer, col(Grant.src_tenant) == tenant, col(Grant.src_group) == group),
            ),
        ).limit(1)
    ).first()
    return found is not None


def hidden_side(session: Session, viewer: str | None, sides: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """The (tenant, group) among `sides` whose details `viewer` may not learn, or None when it may learn all:
    a platform principal (viewer None), its own tenant, the platform's services, and groups it holds a
    grant with are open to it."""
    if viewer is None:
        return None
    for tenant, group in sides:
        if tenant in (viewer, PLATFORM_TENANT):
            continue
        if not knows_group(session, viewer, tenant, group):
            return tenant, group
    return None


def redact(reasons: Sequence[str], tenant: str, uniform: str) -> list[str]:
    """`reasons` without those naming `tenant`, and `uniform` (once) at the end."""
    kept = [r for r in reasons if not mentions(r, tenant) and r != uniform]
    return [*kept, uniform]


def flow_reasons_for(
    session: Session, viewer: str | None, src: tuple[str, str], dst: tuple[str, str], proto: str, port: int,
    allow: bool, reasons: Sequence[str],
) -> list[str]:
    """The reasons of a flow decision as `viewer` may see them (explain)."""
    hidden = None if allow else hidden_side(session, viewer, (src, dst))
    if hidden is None:
        return list(reasons)
    uniform = f"no-grant: no active grant from {src[0]}/{src[1]} to {dst[0]}/{dst[1]} on {proto}/{port}"
    return redact(reasons, hidden[0], uniform)


def grant_reasons_for(
    session: Session, viewer: str | None, dst: tuple[str, str], outcome: str, reasons: Sequence[str]
) -> list[str]:
    """The reasons of a grant request's decision as the requesting tenant `viewer` may see them (the
    source side is its own: a tenant requests for its own groups only)."""
    hidden = None if outcome != "deny" else hidden_side(session, viewer, (dst,))
    if hidden is None:
        return list(reasons)
    uniform = (f"{UNDISCLOSED}: tenant {viewer} holds no grant with {dst[0]}/{dst[1]}; whether it exists, "
               "exposes these ports or is quarantined is undisclosed")
    return redact(reasons, hidden[0], uniform)


# The one word for this hiding: the outcome of a grant request's live answer that depends on a hidden group (an
# API value: explain-grant's `outcome`), and the code of the reason that stands for the hidden ones in a denial.
# Grants, decision records and audit events written before it was one word say `not-disclosed:` there instead.
UNDISCLOSED = "undisclosed"


def grant_preview_for(
    session: Session, viewer: str | None, dst: tuple[str, str], outcome: str, reasons: Sequence[str]
) -> tuple[str, list[str]]:
    """(outcome, reasons) of the live answer to a grant request not yet made (explain-grant), as `viewer` may
    see it. A request made shows its outcome (pending and with whom, or denied), and that is accepted: the
    destination tenant sees the request, it is audited and counts against the pending quota. Asked without a
    trace, the same outcome would map another tenant's groups, the ports they expose and (by the approvers)
    which are sensitive. So when the destination is hidden from `viewer` and the answer depends on it, the
    outcome is UNDISCLOSED with one reason, the same whether the group exists, exposes the ports, is
    sensitive or is quarantined; a denial that the asking side causes by itself (a wildcard port, a TTL over
    the maximum, its own group or quarantine) is shown, as a request would show it."""
    hidden = hidden_side(session, viewer, (dst,))
    if hidden is None:
        return outcome, list(reasons)
    if outcome == "deny" and any(not mentions(r, hidden[0]) for r in reasons):
        return outcome, grant_reasons_for(session, viewer, dst, outcome, reasons)
    return UNDISCLOSED, [f"{UNDISCLOSED}: tenant {viewer} holds no grant with {dst[0]}/{dst[1]}, and the answer "
                         f"depends on it: it is given when the request is made (pending and with whom, or denied), "
                         f"and {dst[0]} sees the request"]

