"""Access grants: request (decided by grants.rego), approve / reject by the named approvers, revoke, list.

A tenant principal requests for its own tenant only and sees grants where it is source or destination;
the state in every response is the effective state at the request time (expiry exact to the second).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from sqlalchemy.exc import IntegrityError

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute, carries_checks
from api.metrics import DECISIONS, EVALUATION, timed
from api.patterns import IDEMPOTENCY_PATTERN
from api.principal import Principal
from api.readcache import ReadCache
from api.routes.common import caller_of, decode_cursor, encode_cursor, grant_decider, request_id
from api.schemas import (
    COMMON_ERRORS,
    ApproveBody,
    CursorQuery,
    GrantCreate,
    GrantOut,
    LimitQuery,
    Page,
    ReasonBody,
    error_responses,
)
from api.writelock import grant_writer
from core.clock import as_utc, iso_z
from core.errors import Forbidden, InvalidInput
from core.vocabulary import GRANT_STATE_PATTERN
from policy import decisionlog
from policy import grants as svc
from policy.models import Grant
from store import carried
from workflows.context import AppContext

router = APIRouter(prefix="/v1", tags=["grants"], route_class=HandedOffRoute)

READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
WRITE_ERRORS = error_responses(*COMMON_ERRORS, 404, 409)
GrantId = Annotated[str, Path(min_length=1, max_length=64, description="grant id")]
STATE_PATTERN = GRANT_STATE_PATTERN


def _utc(value: datetime | None) -> datetime | None:
    return as_utc(value) if value is not None else None


def grant_out(grant: Grant, now: datetime) -> GrantOut:
    state = svc.effective_state(grant, now)
    done = {a.get("as") for a in grant.approvals}
    pending = [a for a in grant.required_approvers if a not in done] if state == "pending" else []
    reasons = list(grant.reasons)
    if state == "expired" and grant.state != "expired":
        reasons.append("expired: approval timed out" if grant.state == "pending" else "expired: ttl elapsed")
    return GrantOut(
        id=grant.id, src_tenant=grant.src_tenant, src_group=grant.src_group, dst_tenant=grant.dst_tenant,
        dst_group=grant.dst_group, proto=grant.proto, ports=list(grant.ports), ttl_seconds=grant.ttl_seconds,
        justification=grant.justification, state=state,
        requested_by=grant.requested_by, requester_tenant=grant.requester_tenant or None,
        required_approvers=list(grant.required_approvers),
        pending_approvers=pending, approvals=list(grant.approvals), reasons=reasons,
        notes=svc.grant_notes(grant, state),
        created_at=as_utc(grant.created_at), decided_at=_utc(grant.decided_at), expires_at=_utc(grant.expires_at),
        pending_until=_utc(grant.pending_until), version=grant.version,
    )


class _Recording:
    """Wraps the decider and keeps what it was asked and answered, for the decision log."""

    def __init__(self, decide: svc.GrantDecider) -> None:
        self.decide = decide
        self.input: dict[str, Any] | None = None
        self.decision: svc.GrantDecision | None = None

    def __call__(self, session: Any, now: datetime, policy_input: dict[str, Any]) -> svc.GrantDecision:
        self.input = policy_input
        with timed(EVALUATION, "grant"):
            self.decision = self.decide(session, now, policy_input)
        DECISIONS.labels("grant", self.decision.outcome).inc()
        return self.decision


def _decision_row(ctx: Any, recorded: _Recording, grant: Grant, owner: str | None) -> Any:
    """Every grant decision goes to the decision log of the principal that asked (`owner`: its tenant, or None
    for the operator's), in the grant's own transaction, with the reasons the grant carries (what the asker
    may see, policy/disclosure.py); a decider that failed is logged as the denial the grant service made.
    The row to add (None: not sampled)."""
    from policy.decide import GrantDecision as LoggedDecision
    from policy.decisionlog import DecisionLog

    d = recorded.decision
    if d is None:
        logged = LoggedDecision("deny", [], list(grant.reasons))
        digest = None
    else:
        logged = LoggedDecision(d.outcome, list(d.approvers), list(grant.reasons))  # type: ignore[arg-type]
        digest = d.policy_hash
    policy_input = recorded.input or {"requester": {"tenant": grant.src_tenant}}
    return DecisionLog(ctx.db, clock=ctx.clock).row("grant", policy_input, logged, digest, owner=owner)


def _src_tenant(principal: Principal, body: GrantCreate) -> str:
    scope = principal.scope_tenant
    if scope is not None:
        if body.src_tenant is not None and body.src_tenant != scope:
            raise Forbidden(f"tenant {scope} may only request grants for its own groups, not {body.src_tenant}")
        return scope
    if body.src_tenant is None:
        raise InvalidInput("src_tenant is required when a platform principal requests a grant: the tenant whose group "
                           "asks (`--src-tenant` on the command line)")
    return body.src_tenant


@router.post(
    "/grants", status_code=201, response_model=GrantOut, responses={**WRITE_ERRORS, 200: {
        "model": GrantOut, "description": "a retry with the same Idempotency-Key: the original grant"}},
    summary="Request a grant: active now, pending with named approvers, or denied with reasons",
)
@carries_checks  # the token's row is read in the decision marker's statement (prepare_request), not one of its own
def request_grant(
    body: GrantCreate, request: Request, principal: PrincipalDep,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", pattern=IDEMPOTENCY_PATTERN,
        description="a retry under the same key answers 200 with the original grant (the key with another request "
                    "is 409); a key belongs to its requester, the principal's id within its tenant, never to "
                    "another tenant's principal of the same id")] = None,
) -> Response:
    # Run by its route (api/handoff.py) as one hand-off to a worker thread, the token check included.
    ctx: AppContext = request.app.state.ctx
    src_tenant = _src_tenant(principal, body)
    authorize(request, principal, "grant.create", src_tenant)
    req = svc.GrantRequest(
        src_tenant=src_tenant, src_group=body.src_group, dst_tenant=body.dst_tenant, dst_group=body.dst_group,
        proto=body.proto, ports=list(body.ports), ttl_seconds=body.ttl_seconds, justification=body.justification,
    )
    caller = caller_of(principal)
    recorded = _Recording(grant_decider(request))
    try:
        grant, created = _request(ctx, req, caller, recorded, idempotency_key, request_id(request),
                                  principal.scope_tenant)
    except IntegrityError:
        # A concurrent retry with the same Idempotency-Key won the insert: answer with its grant.
        if idempotency_key is None:
            raise
        with ctx.db.read_session() as session:
            existing = svc.find_by_idempotency_key(session, caller, idempotency_key)
        if existing is None:
            raise
        if not req.same_as(existing):
            raise svc.GrantConflict("Idempotency-Key was already used for a different grant request") from None
        grant, created = existing, False
    # shaped straight into GrantOut's JSON (grant_view, as the list does; schemathesis holds both to the
    # schema): building the model and validating it again cost a tenth of the request's CPU on the event loop
    return Response(json.dumps(grant_view(grant, ctx.clock()), separators=(",", ":")).encode(),
                    status_code=201 if created else 200, media_type="application/json")


STALE_RETRIES = 3  # decisions made again when a change that may alter them committed before their write


def _request(ctx: Any, req: svc.GrantRequest, caller: svc.Caller, recorded: _Recording, key: str | None,
             rid: str, owner: str | None) -> tuple[Grant, bool]:
    """(grant, created). Decided on reads that follow the audit log's size (the marker: one statement with the
    data version, policy.grants.prepare_request), then written by the group committer
    (store/groupcommit.py): the grant, its audit event and its decision record share one durable commit with
    other small writes, so no request holds the audit head's lock through a COMMIT of its own, and the answer
    is given only after that commit. The write checks, under the head lock, that nothing able to change the
    decision committed since it was made (policy.grants.commit_request); when something did, the request is
    decided again, and after STALE_RETRIES such races decided and written in one transaction."""
    settings = ctx.settings
    for _attempt in range(STALE_RETRIES):
        with ctx.db.read_session(statements=True) as session:  # the marker first, with the data version
            prepared = svc.prepare_request(session, req, caller=caller, decide=recorded, idempotency_key=key,
                                           pending_ttl=settings.grant_pending_ttl, clock=ctx.clock,
                                           max_ttl=settings.max_grant_ttl, carried=carried.pending())
        if isinstance(prepared, Grant):
            return prepared, False
        row = _decision_row(ctx, recorded, prepared.grant, owner)

        def write(session: Any, prepared: svc.PreparedGrant = prepared, row: Any = row) -> Grant:
            return svc.commit_request(session, prepared, caller=caller, quotas=settings.quotas, request_id=rid,
                                      decision_record=row)

        try:
            return ctx.committer.submit(write, late=svc.late_join(prepared, settings.quotas)), True
        except svc.StaleDecision:
            continue
    with grant_writer(ctx), ctx.db.session() as session:
        grant, created = svc.request_grant(
            session, req, caller=caller, decide=recorded, idempotency_key=key,
            pending_ttl=settings.grant_pending_ttl, clock=ctx.clock, request_id=rid,
            quotas=settings.quotas, max_ttl=settings.max_grant_ttl,
        )
        if created:
            row = _decision_row(ctx, recorded, grant, owner)
            if row is not None:
                decisionlog.add(session, row)
    return grant, created


@router.get("/grants", response_model=Page[GrantOut], responses=READ_ERRORS,
            summary="List grants (a tenant sees those where it is source or destination)")
async def list_grants(
    request: Request, ctx: CtxDep, principal: PrincipalDep,
    cursor: CursorQuery = None, limit: LimitQuery = 50,
    state: Annotated[str | None, Query(pattern=STATE_PATTERN)] = None,
    src_tenant: Annotated[str | None, Query(min_length=1, max_length=63)] = None,
    dst_tenant: Annotated[str | None, Query(min_length=1, max_length=63)] = None,
) -> Response:
    # The hot read path: one Core SELECT (read-only, WAL readers never wait) run on the event loop, rows
    # shaped straight into the documented GrantOut JSON (the schemathesis test holds it to the schema).
    scope = principal.scope_tenant
    authorize(request, principal, "grant.read", scope)
    now = ctx.clock()
    cache: ReadCache[bytes] | None = getattr(request.app.state, "grant_pages", None)
    key = (scope, state, src_tenant, dst_tenant, cursor, limit)
    version = None
    if cache is not None:
        body, version = cache.get(key, now)
        if body is not None:
            return Response(body, media_type="application/json")
    with ctx.reader.connect() as conn:
        # Effective states (and so this page, under any filter) change at the next expiry of any grant.
        rows, until, known = svc.grant_rows(
            conn, viewer_tenant=scope, now=now, state=state, src_tenant=src_tenant, dst_tenant=dst_tenant,
            after=decode_cursor(cursor) if cursor is not None else None, limit=limit + 1,
            next_transition=version is not None,
        )
    more = len(rows) > limit
    rows = rows[:limit]
    page = {"items": [grant_view(g, now) for g in rows],
            "next_cursor": encode_cursor(rows[-1].id) if more else None}
    body = json.dumps(page, separators=(",", ":")).encode()
    if cache is not None and known and (until is None or until > now):
        cache.put(key, version, body, until)
    return Response(body, media_type="application/json")


def _iso(value: datetime | None) -> str | None:
    return iso_z(value) if value is not None else None


def grant_view(grant: Any, now: datetime) -> dict[str, Any]:
    """GrantOut as a JSON-ready dict, from an ORM Grant or a plain row (the same attribute names)."""
    state = svc.effective_state(grant, now)
    approvals = list(grant.approvals or [])
    done = {a.get("as") for a in approvals}
    required = list(grant.required_approvers or [])
    reasons = list(grant.reasons or [])
    if state == "expired" and grant.state != "expired":
        reasons.append("expired: approval timed out" if grant.state == "pending" else "expired: ttl elapsed")
    return {
        "id": grant.id, "src_tenant": grant.src_tenant, "src_group": grant.src_group,
        "dst_tenant": grant.dst_tenant, "dst_group": grant.dst_group, "proto": grant.proto,
        "ports": list(grant.ports or []), "ttl_seconds": grant.ttl_seconds, "justification": grant.justification,
        "state": state, "requested_by": grant.requested_by, "requester_tenant": grant.requester_tenant or None,
        "required_approvers": required,
        "pending_approvers": [a for a in required if a not in done] if state == "pending" else [],
        "approvals": approvals, "reasons": reasons, "notes": svc.grant_notes(grant, state),
        "created_at": _iso(grant.created_at),
        "decided_at": _iso(grant.decided_at), "expires_at": _iso(grant.expires_at),
        "pending_until": _iso(grant.pending_until), "version": grant.version,
    }


@router.get("/grants/{grant_id}", response_model=GrantOut, responses=READ_ERRORS, summary="One grant")
def get_grant(grant_id: GrantId, request: Request, ctx: CtxDep, principal: PrincipalDep) -> GrantOut:
    authorize(request, principal, "grant.read", principal.scope_tenant)
    with ctx.db.read_session() as session:
        grant = svc.get_grant(session, grant_id, viewer_tenant=principal.scope_tenant)
    return grant_out(grant, ctx.clock())


@router.post("/grants/{grant_id}/approve", response_model=GrantOut, responses=WRITE_ERRORS,
             summary="Approve as a named approver (destination tenant admin; security for sensitive groups)")
def approve_grant(grant_id: GrantId, request: Request, ctx: CtxDep, principal: PrincipalDep,
                  body: ApproveBody | None = None) -> GrantOut:
    authorize(request, principal, "grant.approve", principal.scope_tenant)
    with grant_writer(ctx), ctx.db.session() as session:
        grant = svc.approve_grant(session, grant_id, caller=caller_of(principal), clock=ctx.clock,
                                  request_id=request_id(request), comment=body.comment if body else "",
                                  decide=grant_decider(request), quotas=ctx.settings.quotas)
    return grant_out(grant, ctx.clock())


@router.post("/grants/{grant_id}/reject", response_model=GrantOut, responses=WRITE_ERRORS,
             summary="Reject a pending grant as a named approver")
def reject_grant(
    grant_id: GrantId, body: ReasonBody, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> GrantOut:
    authorize(request, principal, "grant.reject", principal.scope_tenant)
    caller, rid = caller_of(principal), request_id(request)
    grant = ctx.committer.submit(lambda session: svc.reject_grant(session, grant_id, caller=caller,
                                                                   reason=body.reason, clock=ctx.clock,
                                                                   request_id=rid))
    return grant_out(grant, ctx.clock())


@router.post("/grants/{grant_id}/revoke", response_model=GrantOut, responses=WRITE_ERRORS,
             summary="Revoke a pending or active grant")
def revoke_grant(
    grant_id: GrantId, body: ReasonBody, request: Request, ctx: CtxDep, principal: PrincipalDep
) -> GrantOut:
    authorize(request, principal, "grant.revoke", principal.scope_tenant)
    caller, rid = caller_of(principal), request_id(request)
    grant = ctx.committer.submit(lambda session: svc.revoke_grant(session, grant_id, caller=caller,
                                                                   reason=body.reason, clock=ctx.clock,
                                                                   request_id=rid))
    return grant_out(grant, ctx.clock())
