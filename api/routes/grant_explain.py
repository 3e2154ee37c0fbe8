"""What the policy would decide on a grant request, without making it: the console's request form shows
this live answer (would be approved / needs whom / denied and why) before anything is submitted.

Same scope rule, same decider and same input as POST /v1/grants: a tenant principal asks for its own
tenant only, a platform principal names the source tenant. Nothing is written (no grant, no audit event,
no decision record: nothing was decided, only asked).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep, evaluation_slot
from api.handoff import HandedOffRoute
from api.routes.common import caller_of, grant_decider
from api.schemas import COMMON_ERRORS, error_responses
from core.errors import Forbidden, InvalidInput
from core.vocabulary import SLUG_PATTERN
from policy.grants import GrantRequest, explain_request, grant_notes

router = APIRouter(prefix="/v1/policy", tags=["policy"], route_class=HandedOffRoute)

SlugQuery = Annotated[str, Query(min_length=1, max_length=63, pattern=SLUG_PATTERN)]


class GrantExplainOut(BaseModel):
    # undisclosed: the answer depends on another tenant's group the asking tenant holds no grant with
    # (policy/disclosure.py): it is given when the request is made, which that tenant then sees
    outcome: Literal["approve", "pending", "deny", "undisclosed"]
    approvers: list[str]
    reasons: list[str]
    notes: list[str] = Field(default_factory=list, description=(
        "what the devices would add to the grant's flows, beside the policy's reasons (e.g. udp/4791: RoCEv2 is "
        "symmetric on the SuperNICs); none for a denial"))
    policy_hash: str | None
    input: dict[str, object]


@router.get("/explain-grant", response_model=GrantExplainOut, responses=error_responses(*COMMON_ERRORS),
            summary="The decision a grant request would get now (approve / pending with approvers / deny "
                    "with reasons); nothing is written")
def explain_grant(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    src_group: SlugQuery, dst_tenant: SlugQuery, dst_group: SlugQuery,
    proto: Annotated[Literal["tcp", "udp"], Query()],
    ports: Annotated[list[int], Query(min_length=1, max_length=64)],
    ttl_seconds: Annotated[int, Query(ge=1, le=365 * 86400)],
    src_tenant: Annotated[str | None, Query(min_length=1, max_length=63, pattern=SLUG_PATTERN,
                                            description="platform roles only")] = None,
) -> GrantExplainOut:
    scope = principal.scope_tenant
    if scope is not None and src_tenant is not None and src_tenant != scope:
        raise Forbidden(f"tenant {scope} may only request grants for its own groups, not {src_tenant}")
    source = scope or src_tenant
    if source is None:
        raise InvalidInput("src_tenant is required when a platform principal asks: the tenant whose group would ask "
                           "(`--src-tenant` on the command line)")
    authorize(request, principal, "grant.create", source)
    if any(not 0 <= p <= 65535 for p in ports):
        raise InvalidInput("ports are numbers from 0 to 65535 (the policy says which it accepts)")
    asked = GrantRequest(src_tenant=source, src_group=src_group, dst_tenant=dst_tenant, dst_group=dst_group,
                         proto=proto, ports=list(ports), ttl_seconds=ttl_seconds)
    with evaluation_slot(request, principal), ctx.db.read_session() as session:
        decision, policy_input = explain_request(session, asked, caller=caller_of(principal),
                                                 decide=grant_decider(request), now=ctx.clock())
    return GrantExplainOut(outcome=decision.outcome, approvers=sorted(set(decision.approvers)),
                           reasons=list(decision.reasons), notes=grant_notes(asked, decision.outcome),
                           policy_hash=decision.policy_hash, input=policy_input)
