"""The allowed flow set under the active policy, tenant by tenant (the console's flow matrix), and the
flows of one tenant pair with their reasons. Platform reads (`policy.read`): a tenant asks `explain`.

RoCEv2 (udp/4791, core/rocev2.py) is symmetric on the SuperNICs: where the policy allows A -> B udp/4791, B's
RoCEv2 reaches A too. The list of a pair's flows shows those beside the policy's, as the impact report does
(policy/impact.py), never among them: `items` and `total` stay the policy's flows; `mirrors` (+ `mirrors_total`)
are the pair's udp/4791 flows that pass only as the mirror of an allowed reverse, each `"mirror": "rocev2"` with
a note naming what allows that reverse. The matrix's `cells` and counts stay the policy's too; `mirror_cells`
counts the mirrors between the page's tenants, so a pair with mirrors alone can be opened, and each tenant row's
`mirrors_out_other` / `mirrors_in_other` those to and from the tenants off the page (the "other tenants" row and
column, beside `out_other` / `in_other`). All are read from the same answer, and the reader is a platform
principal, who may see both directions in full (policy/disclosure.py).

The set comes from the app's policy.flowset.FlowSets, kept per process while provably current
(api/caches.py, `flow_set`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from api.authz import authorize
from api.computing import COMPUTING_RESPONSE, computing, prefers_async
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.schemas import COMMON_ERRORS, error_responses
from core.clock import as_utc
from core.rocev2 import MIRROR
from core.vocabulary import SLUG_PATTERN
from policy.flowset import FlowSet, FlowSets
from policy.matrix import matrix_page, pair_listing

router = APIRouter(prefix="/v1/policy", tags=["policy"], route_class=HandedOffRoute)

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
ASYNC_READ = {**READ_ERRORS, **COMPUTING_RESPONSE}
TenantQuery = Annotated[str, Query(min_length=1, max_length=63, pattern=SLUG_PATTERN)]


def flow_sets(request: Request) -> FlowSets:
    sets: FlowSets = request.app.state.flow_sets
    return sets


def flow_set(request: Request, ctx: CtxDep) -> FlowSet | None:
    """The set under the active version now; None (answer 202) when the client prefers an answer at once
    and it is being evaluated (api/computing.py)."""
    if prefers_async(request):
        return flow_sets(request).current_or_start(ctx.clock)
    return flow_sets(request).current(ctx.clock())


class TenantRow(BaseModel):
    tenant: str
    flows: int = Field(description="flows from and to this tenant (inside it counted once)")
    out_other: int = Field(description="flows from this tenant to tenants not on this page")
    in_other: int = Field(description="flows to this tenant from tenants not on this page")
    mirrors_out_other: int = Field(0, description="RoCEv2 mirrors (not policy flows, as in `mirror_cells`) from this "
                                                  "tenant to tenants not on this page")
    mirrors_in_other: int = Field(0, description="RoCEv2 mirrors to this tenant from tenants not on this page")


class MatrixCell(BaseModel):
    src_tenant: str
    dst_tenant: str
    flows: int


class MirrorCell(BaseModel):
    src_tenant: str
    dst_tenant: str
    mirrors: int = Field(description="RoCEv2 flows passing on the wire only as mirrors of allowed dst -> src udp/4791")


class FlowMatrixOut(BaseModel):
    policy_hash: str | None
    computed_at: datetime
    flows: int = Field(description="every allowed flow under the active version")
    tenants_matching: int = Field(description="tenants with at least one flow whose name contains `search`")
    tenants: list[TenantRow] = Field(description="this page: most flows first")
    cells: list[MatrixCell] = Field(description="non-empty cells between this page's tenants")
    next_offset: int | None
    mirror_cells: list[MirrorCell] = Field(
        default_factory=list, description="cells between this page's tenants with RoCEv2 mirrors, not policy flows: "
                                          "a cell of `cells` may have none, a pair with none of `cells` may have some")


class _FlowFields(BaseModel):
    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    port: int


class FlowOut(_FlowFields):
    reasons: list[str]


class MirrorOut(_FlowFields):
    mirror: str = Field(MIRROR, description="passes on the wire only as the RoCEv2 mirror of dst -> src")
    notes: list[str] = Field(description="what allows the reverse flow it mirrors; the policy itself denies this one")


class FlowListOut(BaseModel):
    policy_hash: str | None
    computed_at: datetime
    total: int = Field(description="the policy's flows from src_tenant to dst_tenant")
    items: list[FlowOut]
    next_offset: int | None = Field(description="the next page of items and mirrors, when either has more")
    mirrors_total: int = Field(0, description="RoCEv2 flows from src_tenant to dst_tenant that pass on the wire "
                                              "only as mirrors of allowed dst -> src udp/4791, not policy flows")
    mirrors: list[MirrorOut] = Field(default_factory=list,
                                     description="this page's mirrors (the same offset and limit as items)")


@router.get("/flows/matrix", response_model=FlowMatrixOut, responses=ASYNC_READ,
            summary="Allowed flows by tenant pair under the active version: one page of tenants, most flows first")
def flow_matrix(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    search: Annotated[str, Query(max_length=63, description="tenant name contains")] = "",
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FlowMatrixOut | JSONResponse:
    authorize(request, principal, "policy.read", None)
    flows = flow_set(request, ctx)
    if flows is None:
        return computing()
    page = matrix_page(flows.counts, search=search, offset=offset, limit=limit, mirrors=flows.mirror_counts)
    return FlowMatrixOut(
        policy_hash=flows.policy_hash, computed_at=as_utc(flows.computed_at), flows=page.flows,
        tenants_matching=page.tenants_matching, next_offset=page.next_offset,
        tenants=[TenantRow(tenant=t.tenant, flows=t.flows, out_other=t.out_other, in_other=t.in_other,
                           mirrors_out_other=t.mirrors_out_other, mirrors_in_other=t.mirrors_in_other)
                 for t in page.tenants],
        cells=[MatrixCell(src_tenant=src, dst_tenant=dst, flows=n) for src, dst, n in page.cells],
        mirror_cells=[MirrorCell(src_tenant=src, dst_tenant=dst, mirrors=n) for src, dst, n in page.mirror_cells],
    )


@router.get("/flows", response_model=FlowListOut, responses=ASYNC_READ,
            summary="The allowed flows from one tenant to another under the active version, with their reasons")
def flow_list(
    request: Request, ctx: CtxDep, principal: PrincipalDep, src_tenant: TenantQuery, dst_tenant: TenantQuery,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> FlowListOut | JSONResponse:
    authorize(request, principal, "policy.read", None)
    flows = flow_set(request, ctx)
    if flows is None:
        return computing()
    listing = pair_listing(flows.raw, src_tenant, dst_tenant, offset=offset, limit=limit)
    return FlowListOut(policy_hash=flows.policy_hash, computed_at=as_utc(flows.computed_at), **listing)
