"""The allowed flow set under the active policy, tenant by tenant (the console's flow matrix), and the
flows of one tenant pair with their reasons. Platform reads (`policy.read`): a tenant asks `explain`.

Computing the set means building the data document and evaluating `data.flows.allowed_flows`: about a
second at 1,000 tenants x 10 groups x 5,000 grants. The result is kept per process and reused while it
is provably the one a fresh evaluation would give: on SQLite, while the database's change counter is
unchanged (no commit anywhere), or else while the rows the data document is built from are unchanged
(policy.data.data_fingerprint, one statement) and the active version is the same; and in both cases only
until the earliest expiry of a grant in it. On PostgreSQL every request evaluates afresh.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from api.authz import authorize
from api.context import AppContext
from api.deps import CtxDep, PrincipalDep
from api.readcache import ChangeWatch
from api.schemas import COMMON_ERRORS, SLUG_PATTERN, error_responses
from core.clock import as_utc
from policy import service
from policy.data import build_data, data_fingerprint, live_until, to_ns
from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engine_regorus import RegorusEngine
from policy.matrix import Pair, flows_between, pair_counts, tenant_totals, top_tenants

router = APIRouter(prefix="/v1/policy", tags=["policy"])

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
TenantQuery = Annotated[str, Query(min_length=1, max_length=63, pattern=SLUG_PATTERN)]


@dataclass(frozen=True)
class FlowSet:
    """The compact allowed_flows answer at one instant and its per tenant-pair counts."""

    policy_hash: str | None
    computed_at: datetime
    raw: list[Any]
    counts: dict[Pair, int]
    change_version: int | None  # SQLite PRAGMA data_version when it was known to be current
    fingerprint: tuple[Any, ...] | None
    valid_until_ns: int | None  # earliest grant expiry in the data it was computed from

    def fresh_at(self, now: datetime) -> bool:
        return self.valid_until_ns is None or to_ns(now) < self.valid_until_ns


class FlowSets:
    """One kept FlowSet per process (see the module docstring for when it is reused)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.watch = ChangeWatch(ctx.db.engine, enabled=ctx.settings.read_cache)
        self._kept: FlowSet | None = None
        self._lock = threading.Lock()
        self.evaluations = 0  # for tests and the benchmark

    def current(self) -> FlowSet:
        now = self.ctx.clock()
        version = self.watch.version()  # read before the data: a later commit only makes us check again
        kept = self._kept
        if kept is not None and version is not None and kept.change_version == version and kept.fresh_at(now):
            return kept
        with self._lock:  # one evaluation at a time: a burst after a change waits for the first one
            kept = self._kept
            with self.ctx.db.read_session() as session:
                fingerprint = data_fingerprint(session) if version is not None else None
                active = service.active_version(session)
                digest = active.content_hash if active is not None else None
                if (kept is not None and fingerprint is not None and kept.fingerprint == fingerprint
                        and kept.policy_hash == digest and kept.fresh_at(now)):
                    self._kept = replace(kept, change_version=version)
                    return self._kept
                data = build_data(session, now)
                modules = dict(active.modules) if active is not None else None
            raw: Any = []  # no active version: every flow is denied
            if modules is not None:
                engine = RegorusEngine(modules, data)
                try:
                    raw = engine.evaluate(ALLOWED_FLOWS_QUERY, {"now_ns": to_ns(now)})
                finally:
                    engine.close()
            counts = pair_counts(raw)  # InvalidInput for anything but a list of well-formed entries
            self.evaluations += 1
            self._kept = FlowSet(digest, now, raw, counts, version, fingerprint, live_until(data))
            return self._kept


def flow_sets(request: Request, ctx: AppContext) -> FlowSets:
    kept: FlowSets | None = getattr(request.app.state, "flow_sets", None)
    if kept is None:
        kept = request.app.state.flow_sets = FlowSets(ctx)
    return kept


class TenantRow(BaseModel):
    tenant: str
    flows: int = Field(description="flows from and to this tenant (inside it counted once)")
    out_other: int = Field(description="flows from this tenant to tenants not on this page")
    in_other: int = Field(description="flows to this tenant from tenants not on this page")


class MatrixCell(BaseModel):
    src_tenant: str
    dst_tenant: str
    flows: int


class FlowMatrixOut(BaseModel):
    policy_hash: str | None
    computed_at: datetime
    flows: int = Field(description="every allowed flow under the active version")
    tenants_matching: int = Field(description="tenants with at least one flow whose name contains `search`")
    tenants: list[TenantRow] = Field(description="this page: most flows first")
    cells: list[MatrixCell] = Field(description="non-empty cells between this page's tenants")
    next_offset: int | None


class FlowOut(BaseModel):
    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    port: int
    reasons: list[str]


class FlowListOut(BaseModel):
    policy_hash: str | None
    computed_at: datetime
    total: int
    items: list[FlowOut]
    next_offset: int | None


@router.get("/flows/matrix", response_model=FlowMatrixOut, responses=READ_ERRORS,
            summary="Allowed flows by tenant pair under the active version: one page of tenants, most flows first")
def flow_matrix(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    search: Annotated[str, Query(max_length=63, description="tenant name contains")] = "",
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FlowMatrixOut:
    authorize(request, principal, "policy.read", None)
    flows = flow_sets(request, ctx).current()
    page, matching = top_tenants(flows.counts, search=search, offset=offset, limit=limit)
    on_page = set(page)
    totals = tenant_totals(flows.counts)
    out_other = dict.fromkeys(page, 0)
    in_other = dict.fromkeys(page, 0)
    cells: list[MatrixCell] = []
    for (src, dst), n in flows.counts.items():
        if src in on_page and dst in on_page:
            cells.append(MatrixCell(src_tenant=src, dst_tenant=dst, flows=n))
        elif src in on_page:
            out_other[src] += n
        elif dst in on_page:
            in_other[dst] += n
    cells.sort(key=lambda c: (c.src_tenant, c.dst_tenant))
    return FlowMatrixOut(
        policy_hash=flows.policy_hash, computed_at=as_utc(flows.computed_at), flows=sum(flows.counts.values()),
        tenants_matching=matching, cells=cells,
        tenants=[TenantRow(tenant=t, flows=totals[t], out_other=out_other[t], in_other=in_other[t]) for t in page],
        next_offset=offset + limit if offset + limit < matching else None,
    )


@router.get("/flows", response_model=FlowListOut, responses=READ_ERRORS,
            summary="The allowed flows from one tenant to another under the active version, with their reasons")
def flow_list(
    request: Request, ctx: CtxDep, principal: PrincipalDep, src_tenant: TenantQuery, dst_tenant: TenantQuery,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> FlowListOut:
    authorize(request, principal, "policy.read", None)
    flows = flow_sets(request, ctx).current()
    between = flows_between(flows.raw, src_tenant, dst_tenant)
    items = [FlowOut(**f._asdict(), reasons=reasons) for f, reasons in list(between.items())[offset:offset + limit]]
    return FlowListOut(
        policy_hash=flows.policy_hash, computed_at=as_utc(flows.computed_at), total=len(between), items=items,
        next_offset=offset + limit if offset + limit < len(between) else None,
    )
