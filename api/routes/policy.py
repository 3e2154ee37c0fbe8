"""Policy versions, impact, explain and the decision log. Thin: parse, authorize (api_authz.rego),
call policy.service, let api/errors.py map the domain errors."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.authz import authorize
from api.computing import COMPUTING_RESPONSE, computing, prefers_async
from api.deps import CtxDep, PrincipalDep, evaluation_slot
from api.handoff import HandedOffRoute
from api.metrics import DECISIONS, EVALUATION, timed
from api.patterns import HEX_PATTERN
from api.schemas import COMMON_ERRORS, error_responses
from core.errors import Forbidden
from core.vocabulary import SLUG_PATTERN
from enforcer.service import withheld_notes
from policy import service
from policy.decide import FlowDecision, parse_identity
from policy.decisionlog import DecisionLog, query_decisions
from policy.disclosure import flow_reasons_for
from policy.grant_decider import RegoGrantDecider
from policy.versions import MAX_MODULES
from policy.views import DecisionOut, VersionDetail, VersionOut, decision_out, version_out
from workflows import policy as policy_flows
from workflows.impacts import ImpactReports

router = APIRouter(prefix="/v1/policy", tags=["policy"], route_class=HandedOffRoute)

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
WRITE_ERRORS = error_responses(*COMMON_ERRORS, 404, 409)
VersionRef = Annotated[str, PathParam(min_length=1, max_length=64, pattern=HEX_PATTERN,
                                      description="version number or content-hash prefix (8+ hex)")]


class ModulesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modules: dict[str, Annotated[str, Field(max_length=1_000_000)]] = Field(
        max_length=MAX_MODULES, description="path (ending .rego) -> Rego text; *_test.rego included")
    note: str = Field(default="", max_length=2000)


class ActivateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    signature: str | None = Field(default=None, max_length=512,
                                  description="base64 signature over the content hash (ASCII hex)")
    reason: str | None = Field(default=None, max_length=500)


class ValidateOut(BaseModel):
    content_hash: str
    modules: list[str]


class ExplainOut(BaseModel):
    allow: bool
    reasons: list[str]
    notes: list[str] = Field(default_factory=list, description=(
        "what the devices add to the policy's answer, which stays as it is (e.g. RoCEv2, udp/4791, the policy "
        "denies but the SuperNICs let through as the mirror of the reverse flow the policy allows)"))
    policy_hash: str | None
    input: dict[str, Any]


@router.post("/validate", response_model=ValidateOut, responses=error_responses(*COMMON_ERRORS),
             summary="Compile modules (errors carry file:line:col); nothing is stored")
def validate(body: ModulesBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> ValidateOut:
    authorize(request, principal, "policy.validate", None)
    return ValidateOut(content_hash=policy_flows.validate(ctx.settings, body.modules), modules=sorted(body.modules))


@router.post("/test", responses=error_responses(*COMMON_ERRORS),
             summary="Compile and run every test_* rule; per-test pass/fail and time")
def run_tests(body: ModulesBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    authorize(request, principal, "policy.test", None)
    return policy_flows.test(ctx.settings, body.modules).to_dict()


@router.post("/versions", status_code=201, response_model=VersionOut, responses=WRITE_ERRORS,
             summary="Upload a version: compiled, its Rego tests run; identical content returns the stored one")
def upload(body: ModulesBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> VersionOut:
    authorize(request, principal, "policy.upload", None)
    prepared = policy_flows.prepare(ctx.settings, body.modules)  # compile + Rego tests, sandboxed, before the write
    with ctx.db.session() as session:
        version, _created = service.upload(session, prepared, principal.actor(), now=ctx.clock(),
                                           note=body.note)
        return version_out(version)


@router.get("/versions", response_model=list[VersionOut], responses=READ_ERRORS, summary="Every version")
def list_versions(request: Request, ctx: CtxDep, principal: PrincipalDep) -> list[VersionOut]:
    authorize(request, principal, "policy.read", None)
    with ctx.db.read_session() as session:
        return [version_out(v) for v in service.list_versions(session)]


@router.get("/active", response_model=VersionDetail, responses=READ_ERRORS, summary="The version in force")
def show_active(request: Request, ctx: CtxDep, principal: PrincipalDep) -> VersionOut:
    authorize(request, principal, "policy.read", None)
    with ctx.db.read_session() as session:
        current = service.active_version(session)
        if current is None:
            from core.errors import NotFound

            raise NotFound("no policy version is active")
        return version_out(current, detail=True)


@router.get("/versions/{ref}", response_model=VersionDetail, responses=READ_ERRORS,
            summary="One version with its sources and test results")
def show(ref: VersionRef, request: Request, ctx: CtxDep, principal: PrincipalDep) -> VersionOut:
    authorize(request, principal, "policy.read", None)
    with ctx.db.read_session() as session:
        return version_out(service.get_version(session, ref), detail=True)


@router.get("/versions/{ref}/impact", response_model=dict[str, Any], responses={**READ_ERRORS, **COMPUTING_RESPONSE},
            summary="Flows the version opens and closes against the active one, on the current inventory")
def impact(ref: VersionRef, request: Request, ctx: CtxDep, principal: PrincipalDep,
           limit: Annotated[int, Query(ge=0, le=100_000)] = 1000) -> dict[str, Any] | JSONResponse:
    authorize(request, principal, "policy.impact", None)
    reports: ImpactReports = request.app.state.impacts
    budget, limits = ctx.settings.budget(), policy_flows.limits(ctx.settings)
    if not prefers_async(request):
        return reports.report(ref, now=ctx.clock(), budget=budget, limits=limits, limit=limit)
    report = reports.report_or_start(ref, clock=ctx.clock, budget=budget, limits=limits, limit=limit)
    return computing() if report is None else report


@router.post("/versions/{ref}/activate", response_model=VersionOut, responses=WRITE_ERRORS,
             summary="Put a version in force (tests present and passing, a signature outside development mode, "
                     "the two-person rule when on, decisions within their budget on the current data, its decision "
                     "agreeing with its allowed_flows: 409 naming the flows otherwise)")
def activate(ref: VersionRef, body: ActivateBody, request: Request, ctx: CtxDep,
             principal: PrincipalDep) -> VersionOut:
    authorize(request, principal, "policy.activate", None)
    v = policy_flows.switch(ctx, "activate", ref, principal.actor(), signature=body.signature, reason=body.reason)
    return version_out(v)


@router.post("/versions/{ref}/rollback", response_model=VersionOut, responses=WRITE_ERRORS,
             summary="Go back to an earlier version")
def rollback(ref: VersionRef, body: ActivateBody, request: Request, ctx: CtxDep,
             principal: PrincipalDep) -> VersionOut:
    authorize(request, principal, "policy.rollback", None)
    v = policy_flows.switch(ctx, "rollback", ref, principal.actor(), signature=body.signature, reason=body.reason)
    return version_out(v)


@router.get("/explain", response_model=ExplainOut, responses=READ_ERRORS,
            summary="The decision on one flow under the active version, with the reasons")
def explain(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    src: Annotated[str, Query(min_length=3, max_length=2048, description="SPIFFE ID or tenant/group")],
    dst: Annotated[str, Query(min_length=3, max_length=2048, description="SPIFFE ID or tenant/group")],
    port: Annotated[int, Query(ge=1, le=65535)],
    proto: Annotated[Literal["tcp", "udp"], Query()] = "tcp",
) -> ExplainOut:
    scope = principal.scope_tenant
    authorize(request, principal, "policy.explain", scope)
    src_id, dst_id = parse_identity(src), parse_identity(dst)
    if scope is not None and scope not in (src_id["tenant"], dst_id["tenant"]):
        raise Forbidden(f"tenant {scope} may only explain flows from or to its own groups")
    decider = getattr(request.app.state, "grant_decider", None)
    kept = decider if isinstance(decider, RegoGrantDecider) else None  # its engine and document: no rebuild
    with evaluation_slot(request, principal):  # the decision and its record: the work one explain costs
        with ctx.db.read_session(snapshot=True) as session:  # one snapshot: the decider may keep the document
            with timed(EVALUATION, "flow"):
                decision, digest = service.explain(session, src, dst, port, proto=proto, now=ctx.clock(), kept=kept)
            reasons = flow_reasons_for(session, scope, (src_id["tenant"], src_id["group"]),
                                       (dst_id["tenant"], dst_id["group"]), proto, port, decision.allow,
                                       decision.reasons)
            notes = service.mirror_notes(session, src, dst, port, decision, proto=proto, now=ctx.clock(),
                                         viewer=scope, kept=kept)
            if decision.allow:  # a device over budget may withhold what allows it (enforcer.fairshare)
                notes += withheld_notes(session, f"{dst_id['tenant']}/{dst_id['group']}", proto, decision.reasons)
        DECISIONS.labels("flow", "allow" if decision.allow else "deny").inc()
        shown = FlowDecision(decision.allow, reasons)
        asked = {"src": src_id, "dst": dst_id, "proto": proto, "port": port}
        DecisionLog(ctx.db, clock=ctx.clock).record("flow", asked, shown, digest, owner=scope)
    return ExplainOut(allow=shown.allow, reasons=shown.reasons, notes=notes, policy_hash=digest, input=asked)


@router.get("/decisions", response_model=list[DecisionOut], responses=READ_ERRORS,
            summary="Sampled decision records, newest first")
def decisions(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    kind: Annotated[Literal["flow", "grant", "authz"] | None, Query()] = None,
    # a slug, as /v1/audit/events takes it: 'Acme' was answered with no records, as if acme had none
    tenant: Annotated[str | None, Query(min_length=1, max_length=63, pattern=SLUG_PATTERN)] = None,
    allowed: Annotated[bool | None, Query()] = None,
    since: Annotated[datetime | None, Query(description="inclusive, with a timezone")] = None,
    until: Annotated[datetime | None, Query(description="exclusive, with a timezone")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[DecisionOut]:
    own = principal.scope_tenant
    authorize(request, principal, "decision.read", own)
    if own is not None:  # a tenant principal reads its own tenant's decisions, whatever the query says
        if tenant is not None and tenant != own:
            raise Forbidden(f"{principal.id} may only read decisions of tenant {own!r}")
        tenant = own
    with ctx.db.read_session() as session:
        return [decision_out(r) for r in query_decisions(session, kind=kind, tenant=tenant, allowed=allowed,
                                                         since=since, until=until, limit=limit)]
