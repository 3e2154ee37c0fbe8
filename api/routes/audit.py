"""Audit routes: events (paged, filtered), the signed checkpoint, Merkle proofs, exports.

Platform roles the policy lets read the audit log (admin, security, auditor) see every event; a tenant
principal sees only its own tenant's events, whatever the query says (its tenant comes from its token).
"""

from __future__ import annotations

import base64
import secrets
import tempfile
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.principal import Principal
from api.routes.common import decode_cursor, encode_cursor, request_id
from api.schemas import COMMON_ERRORS, CursorQuery, error_responses
from audit import checkpoint as cp
from audit import service
from audit.actor import ACTOR_QUERY_MAX
from audit.export import FORMATS, ExportFilter, FormatName
from audit.models import AuditEvent
from core.clock import as_utc, require_aware
from core.digits import is_digits
from core.errors import Forbidden, InvalidInput, NotFound
from core.vocabulary import AUDIT_ACTION_PATTERN, SLUG_PATTERN
from workflows import exports

router = APIRouter(prefix="/v1/audit", tags=["audit"], route_class=HandedOffRoute)
ERRORS = error_responses(*COMMON_ERRORS)
ERRORS_404 = error_responses(*COMMON_ERRORS, 404)

SLUG = SLUG_PATTERN
ACTION = AUDIT_ACTION_PATTERN
TenantQuery = Annotated[str | None, Query(min_length=1, max_length=63, pattern=SLUG)]
ActionQuery = Annotated[str | None, Query(min_length=3, max_length=64, pattern=ACTION)]
MAX_INDEX = 2**53

# The actor filter, one definition for the event list's query and the export's body (audit.actor.ActorQuery).
ACTOR_SPEC: dict[str, Any] = {
    "min_length": 1, "max_length": ACTOR_QUERY_MAX,  # an id (512) @ a tenant (63)
    "description": "an actor as the log shows it: `alice@acme` is acme's alice only (or an actor of no tenant whose "
    "id is `alice@acme`); `alice`, with no tenant part, is alice of every tenant and of none; with actor_tenant, the "
    "bare id within that tenant"}
ACTOR_TENANT_SPEC: dict[str, Any] = {
    "min_length": 1, "max_length": 63, "pattern": SLUG,
    "description": "only events whose actor belongs to this tenant (with actor: that actor's id there)"}
EXPORT_ACTOR_NOTE = (". An export narrowed by actor verifies each event it holds (authentic, in place, that actor's) "
                     "but cannot be proven complete: the log keeps no count of an actor's events, so `audit verify` "
                     "reports it UNPROVEN (exit 3); a tenant or action selection is proven complete")


class ActorOut(BaseModel):
    id: str
    kind: str
    tenant: str | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the tenant of a principal confined to one (a tenant role, a workload): acme's `alice` is "
        "`alice@acme`; absent for a platform role, a node or the system, and from events written before actors "
        "named their tenant (absent, not null: the object is the hashed one)")


class ObjectOut(BaseModel):
    type: str
    id: str


class EventOut(BaseModel):
    seq: int
    ts: str = Field(description="UTC, RFC 3339 with microseconds")
    actor: ActorOut
    tenant: str | None
    action: str
    object: ObjectOut
    summary: dict[str, Any]
    reason: str | None
    request_id: str | None
    prev_hash: str
    leaf_hash: str
    v: int = Field(description="version of the hashed event document")
    counters: dict[str, int] | None = Field(
        None, description="the event's number per tenant, action and tenant+action, hashed with it (absent "
        "from events written before the log kept them): with the fields above, the leaf hash's whole input")


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None = None


class CheckpointOut(BaseModel):
    origin: str
    size: int
    root_hash: str = Field(description="base64, as in the signed note")
    note: str = Field(description="C2SP signed note (tlog-checkpoint), Ed25519")
    created_at: datetime
    public_key: str = Field(description="the audit public key, PEM")


class InclusionOut(BaseModel):
    index: int
    tree_size: int
    leaf_hash: str
    proof: list[str] = Field(description="base64 hashes, leaf to root (RFC 6962 audit path)")
    root_hash: str
    checkpoint: str | None = Field(None, description="the signed checkpoint of this tree size, when one exists")


class ConsistencyOut(BaseModel):
    first: int
    second: int
    first_root: str
    second_root: str
    proof: list[str]


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: FormatName = "jsonl"
    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = Field(None, min_length=1, max_length=63, pattern=SLUG)
    action: str | None = Field(None, min_length=3, max_length=64, pattern=ACTION)
    actor: str | None = Field(None, **{**ACTOR_SPEC, "description": ACTOR_SPEC["description"] + EXPORT_ACTOR_NOTE})
    actor_tenant: str | None = Field(None, **ACTOR_TENANT_SPEC)
    since_checkpoint: str | None = Field(
        None,
        max_length=4096,
        description="a signed checkpoint note kept earlier: the export's header carries the RFC 6962 "
        "consistency proof from it (verify with `audit verify --since-checkpoint`)",
    )
    include_decisions: bool = Field(
        False, strict=True,  # a JSON boolean, as every flag of a request body here
        description="also export the policy decision records (same since/until/tenant; needs decision.read): "
        "the response is then multipart/mixed with the audit export and audit-export.decisions.jsonl",
    )


def event_out(e: AuditEvent) -> EventOut:
    document = service.event_document(e)
    return EventOut(
        v=document["v"],
        counters=document.get("counters"),
        seq=e.seq,
        ts=service.format_ts(e.ts),
        actor=ActorOut(**document["actor"]),
        tenant=e.tenant,
        action=e.action,
        object=ObjectOut(type=e.object_type, id=e.object_id),
        summary=e.summary,
        reason=e.reason,
        request_id=e.request_id,
        prev_hash=e.prev_hash,
        leaf_hash=e.leaf_hash,
    )


def _b64(h: bytes) -> str:
    return base64.b64encode(h).decode()


def _scope(request: Request, principal: Principal, action: str, tenant: str | None) -> str | None:
    """The tenant filter to apply: a tenant principal is confined to its own tenant."""
    own = principal.scope_tenant
    if own is not None:
        if tenant is not None and tenant != own:
            raise Forbidden(f"{principal.id} may only read audit events of tenant {own!r}")
        tenant = own
    authorize(request, principal, action, own)
    return tenant


def _aware(value: datetime | None, name: str) -> datetime | None:
    if value is not None:
        require_aware(value, name)
    return value


@router.get("/events", response_model=EventPage, responses=ERRORS,
            summary="Audit events, oldest first (order=desc: newest first)")
def list_events(
    request: Request,
    ctx: CtxDep,
    principal: PrincipalDep,
    tenant: TenantQuery = None,
    action: ActionQuery = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    actor: Annotated[str | None, Query(**ACTOR_SPEC)] = None,
    actor_tenant: Annotated[str | None, Query(**ACTOR_TENANT_SPEC)] = None,
    order: Annotated[Literal["asc", "desc"], Query(
        description="asc: oldest first; desc: newest first (the cursor and `after` then go to older events)")] = "asc",
    after: Annotated[int | None, Query(ge=0, le=MAX_INDEX, description=(
        "the sequence number of the last event already seen: the events past it in `order` (what the cursor "
        "carries, in the open: give one or the other)"))] = None,
) -> EventPage:
    scoped = _scope(request, principal, "audit.read", tenant)
    if cursor is not None:
        if after is not None:
            raise InvalidInput("give either cursor or after, not both (the cursor is the previous page's `after`)")
        raw = decode_cursor(cursor)
        if not is_digits(raw) or int(raw) > MAX_INDEX:
            raise InvalidInput("cursor is not one this API returned")
        after = int(raw)
    with ctx.db.read_session() as session:
        rows = service.list_events(
            session,
            tenant=scoped,
            action=action,
            since=_aware(since, "since"),
            until=_aware(until, "until"),
            after=after,
            limit=limit,
            actor=actor,
            actor_tenant=actor_tenant,
            newest_first=order == "desc",
        )
    nxt = encode_cursor(str(rows[-1].seq)) if len(rows) == limit else None
    return EventPage(items=[event_out(e) for e in rows], next_cursor=nxt)


def _visible_event(session: Any, seq: int, own: str | None) -> AuditEvent:
    """Event `seq`, or NotFound when it does not exist or belongs to another tenant than the caller's."""
    event = service.get_event(session, seq)
    if event is None or (own is not None and event.tenant != own):
        raise NotFound(f"audit event {seq} not found")
    return event


@router.get("/events/{seq}", response_model=EventOut, responses=ERRORS_404, summary="One audit event")
def get_event(
    seq: Annotated[int, Path(ge=0, le=MAX_INDEX)], request: Request, ctx: CtxDep, principal: PrincipalDep
) -> EventOut:
    own = _scope(request, principal, "audit.read", None)
    with ctx.db.read_session() as session:
        return event_out(_visible_event(session, seq, own))


def _signer(ctx: CtxDep) -> cp.CheckpointSigner:
    return cp.audit_signer(ctx.keystore)


def _origin(ctx: CtxDep) -> str:
    return exports.log_origin(ctx)


@router.get("/checkpoint", response_model=CheckpointOut, responses=ERRORS_404, summary="The latest signed checkpoint")
def get_checkpoint(request: Request, ctx: CtxDep, principal: PrincipalDep) -> CheckpointOut:
    _scope(request, principal, "audit.read", None)
    signer = _signer(ctx)
    exports.checkpoint_writer(ctx, floor=1).maybe_write()
    with ctx.db.read_session() as session:
        latest = cp.latest_checkpoint(session)
    if latest is None:  # an empty log still has a (size 0) checkpoint to anchor to
        latest = cp.write_checkpoint(ctx.db, signer, origin=_origin(ctx), clock=ctx.clock)
    return CheckpointOut(
        origin=latest.origin,
        size=latest.size,
        root_hash=_b64(bytes.fromhex(latest.root_hash)),
        note=latest.note,
        created_at=as_utc(latest.created_at),
        public_key=cp.public_key_pem(signer),
    )


@router.get(
    "/proof/inclusion",
    response_model=InclusionOut,
    responses=ERRORS_404,
    summary="RFC 6962 inclusion proof of one event in a tree size (default: the latest checkpoint)",
)
def inclusion(
    request: Request,
    ctx: CtxDep,
    principal: PrincipalDep,
    index: Annotated[int, Query(ge=0, le=MAX_INDEX)],
    tree_size: Annotated[int | None, Query(ge=1, le=MAX_INDEX)] = None,
) -> InclusionOut:
    own = _scope(request, principal, "audit.read", None)
    with ctx.db.read_session() as session:
        event = _visible_event(session, index, own)
        note = None
        if tree_size is None:
            latest = cp.latest_checkpoint(session)
            if latest is None or latest.size <= index:
                raise NotFound(f"no signed checkpoint covers event {index} yet; retry shortly")
            tree_size, note = latest.size, latest.note
        if index >= tree_size:
            raise InvalidInput(f"event {index} is not in a tree of size {tree_size}")
        proof = service.inclusion_proof(session, index, tree_size)
        root = service.root_at(session, tree_size)
        if note is None:
            stored = cp.checkpoint_of_size(session, tree_size)
            note = stored.note if stored is not None else None
    return InclusionOut(
        index=index,
        tree_size=tree_size,
        leaf_hash=_b64(bytes.fromhex(event.leaf_hash)),
        proof=[_b64(h) for h in proof],
        root_hash=_b64(root),
        checkpoint=note,
    )


@router.get(
    "/proof/consistency",
    response_model=ConsistencyOut,
    responses=ERRORS,
    summary="RFC 6962 proof that the tree of size `first` is a prefix of the tree of size `second`",
)
def consistency(
    request: Request,
    ctx: CtxDep,
    principal: PrincipalDep,
    first: Annotated[int, Query(ge=1, le=MAX_INDEX)],
    second: Annotated[int, Query(ge=1, le=MAX_INDEX)],
) -> ConsistencyOut:
    _scope(request, principal, "audit.read", None)
    if first > second:
        raise InvalidInput("first must not be larger than second")
    with ctx.db.read_session() as session:
        proof = service.consistency_proof(session, first, second)
        r1, r2 = service.root_at(session, first), service.root_at(session, second)
    return ConsistencyOut(
        first=first, second=second, first_root=_b64(r1), second_root=_b64(r2), proof=[_b64(h) for h in proof]
    )


MEDIA = {name: f.media_type for name, f in FORMATS.items()}
EXTENSION = {name: f.extension for name, f in FORMATS.items()}
DECISIONS_FILE = "audit-export.decisions.jsonl"


def _multipart(parts: list[tuple[str, str, Any]], boundary: str) -> Iterator[bytes]:
    """multipart/mixed (RFC 2046): each part a whole file with its own type and attachment filename."""
    for media, filename, spool in parts:
        yield (
            f"--{boundary}\r\nContent-Type: {media}\r\n"
            f'Content-Disposition: attachment; filename="{filename}"\r\n\r\n'
        ).encode()
        while chunk := spool.read(1 << 16):
            yield chunk
        yield b"\r\n"
    yield f"--{boundary}--\r\n".encode()


@router.post(
    "/exports",
    responses={
        200: {
            "description": "the export file (JSONL, CSV or OCSF JSON lines); with include_decisions, "
            "multipart/mixed: the export file, then audit-export.decisions.jsonl",
            "content": {"application/x-ndjson": {}, "text/csv": {}, "multipart/mixed": {}},
        },
        **ERRORS_404,
    },
    response_class=StreamingResponse,
    summary="A verifiable export (JSONL, CSV or OCSF) with the signed checkpoint; streamed back",
)
def create_export(body: ExportRequest, request: Request, ctx: CtxDep, principal: PrincipalDep) -> StreamingResponse:
    own = principal.scope_tenant
    if own is not None:  # a tenant exports (reads) its own events only
        tenant = _scope(request, principal, "audit.read", body.tenant)
    else:
        authorize(request, principal, "audit.export", None)
        tenant = body.tenant
    if body.include_decisions:
        # Decisions are read under their own permission, in the principal's tenant scope (never the body's):
        # a tenant principal's export holds only its tenant's decisions (`tenant` is its own here).
        authorize(request, principal, "decision.read", own)
    filters = ExportFilter(
        since=_aware(body.since, "since"), until=_aware(body.until, "until"), tenant=tenant, action=body.action,
        actor=body.actor, actor_tenant=body.actor_tenant,
    )
    exports.check_filters(filters, with_decisions=body.include_decisions)
    spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115 (closed by the stream)
    spools = [spool]
    try:
        if body.include_decisions:
            spools.append(tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024))  # noqa: SIM115 (closed below)
        exports.export_audit(
            ctx, spool, fmt=body.format, filters=filters, actor=principal.actor(),
            decisions_out=spools[1] if body.include_decisions else None, request_id=request_id(request),
            since_checkpoint=body.since_checkpoint,
        )
    except BaseException:
        for f in spools:
            f.close()
        raise
    for f in spools:
        f.seek(0)

    def stream() -> Iterator[bytes]:
        try:
            if len(spools) == 1:
                while chunk := spool.read(1 << 16):
                    yield chunk
            else:
                parts = [
                    (MEDIA[body.format], f"audit-export.{EXTENSION[body.format]}", spool),
                    ("application/x-ndjson", DECISIONS_FILE, spools[1]),
                ]
                yield from _multipart(parts, boundary)
        finally:
            for f in spools:
                f.close()

    if len(spools) == 1:
        return StreamingResponse(
            stream(),
            media_type=MEDIA[body.format],
            headers={"Content-Disposition": f'attachment; filename="audit-export.{EXTENSION[body.format]}"'},
        )
    boundary = "tf-" + secrets.token_hex(16)
    return StreamingResponse(stream(), media_type=f"multipart/mixed; boundary={boundary}")
