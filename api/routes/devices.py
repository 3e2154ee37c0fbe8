"""The device API the node agents use, and the device list (and one device) the console, `device list|show`
and `enforcer status` read.

- `GET /v1/devices/{device}/ruleset`: the desired version, its content hash and the IR (agents render it
  locally with the pure renderers, so the hash signed off here is the one applied). Strong `ETag` = the
  content hash; `If-None-Match` with the current hash is 304; with `?wait=<s>` (at most 60) the request is
  held until a newer version is published (then 200) or the time is up (then 304). A held request holds no
  thread and no database connection (api/enforcement.py).
- `GET /v1/devices/{device}/versions`: the versions published for the device, newest first, with why
  (cause), by whom and when (paged by `before`); the rule sets themselves through .../ruleset.
- `GET /v1/devices/leaf:<name>/fabric`: what a Linux leaf routes by besides its rule set (enforcer/leaf_view.py):
  tenants, cables, placed addresses; ETag its hash (enforcer.leaf_view.view_hash), which a leaf's rule set
  names in `X-Fabric-View`: the lab's leaf agents read the view again only when that hash changed.
- `POST /v1/devices/{device}/status`: what the agent applied, per-rule counters, drift, last error; stored
  (the latest per device) and audited when the applied version or the drift state changes. A report numbered
  (`report_seq`) at or below the stored one arrived after a newer one: 200 with the stored row and
  `stale: true`, nothing changed, no event.

Who may: a node's SVID (mTLS) reads and reports only its own devices: `spiffe://<td>/node/<n>` is `nic:<n>`
and, when `n` is a leaf of the fabric, `leaf:<n>` (a leaf's agent joins with a join token made for the
leaf's name: node, leaf and spine names never collide). Admins and security read any device (auditors too);
anything else is 403, and a node reaching for another node's device is logged and kept in the decision
log as an authorization denial.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep, authenticate, authenticated_in_thread
from api.handoff import HandedOffRoute
from api.principal import Principal
from api.routes.common import request_id
from api.schemas import COMMON_ERRORS, error_responses
from api.workers import in_worker
from core.clock import as_utc
from core.errors import Forbidden, NotFound
from enforcer import service
from enforcer.service import DEVICE_PATTERN

log = logging.getLogger("trustfabric.api.devices")
VIEW_HEADER = "X-Fabric-View"
router = APIRouter(prefix="/v1", tags=["devices"], route_class=HandedOffRoute)

DevicePath = Annotated[str, PathParam(min_length=5, max_length=80, pattern=DEVICE_PATTERN,
                                      description="nic:<node> or leaf:<name>", examples=["nic:gpu1"])]
READ_ERRORS = error_responses(*COMMON_ERRORS, 404)
WRITE_ERRORS = error_responses(*COMMON_ERRORS, 404)
MAX_WAIT = 60


class Counter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    packets: int = Field(ge=0)
    bytes: int = Field(ge=0)


class StatusReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    applied_version: StrictInt | None = Field(default=None, ge=1, description="the version the device runs now (a JSON "
                                               "integer: true, \"7\" or 7.0 is 422)")
    applied_hash: str | None = Field(default=None, pattern="^[0-9a-f]{64}$", description="its content hash")
    counters: dict[Annotated[str, Field(max_length=128)], Counter] = Field(
        default_factory=dict, max_length=service.MAX_COUNTERS,
        description="per rule, keyed by OpenFlow cookie (hex) or reason: packets and bytes matched")
    drift: list[Annotated[str, Field(max_length=500)]] = Field(
        default_factory=list, max_length=200, description="how the device differed from its rule set")
    drift_repaired: StrictBool = Field(default=False, description="the drift was repaired by re-applying (a JSON "
                                       "boolean: \"yes\" or 1 is 422, not read as true)")
    last_error: str | None = Field(default=None, max_length=2000)
    report_seq: StrictInt | None = Field(
        default=None, ge=1, le=service.MAX_REPORT_SEQ,
        description="the agent's number for this report, growing across its restarts: a report numbered at or "
                    "below the device's stored one arrived late and changes nothing (answered with `stale`); one "
                    "more than 7 days ahead of the server's clock in ns since the epoch is 400; a JSON integer, "
                    "never true, \"7\" or 7.0 (422)")


class DeviceOut(BaseModel):
    device: str
    kind: str
    in_fabric: bool
    desired_version: int
    desired_hash: str | None
    pinned: bool
    pending_hash: str | None
    applied_version: int | None
    applied_hash: str | None
    in_sync: bool
    applied_at: Any
    reported_at: Any
    drift: list[str]
    drift_repaired: bool
    last_error: str | None
    counters: dict[str, Any]
    report_seq: int | None = Field(description="the number of the stored report (None: not numbered)")
    withheld: list[dict[str, Any]] = Field(default_factory=list, description=(
        "what the published rule set withholds to fit the device's budget, per tenant over its fair share: "
        "[{tenant, entries, cost}] (empty: nothing)"))


class StatusOut(DeviceOut):
    stale: bool = Field(description="true: the report was numbered at or below the stored one (it arrived after a "
                                    "newer one) and changed nothing; the row is the stored one")


class RuleSetOut(BaseModel):
    """The shape of a 200 from GET .../ruleset (served from the stored bytes, not re-serialized)."""

    device: str
    version: int
    content_hash: str
    cause: str
    published_at: str
    ir: dict[str, Any] = Field(description="enforcer.ir.DeviceRuleSet.to_dict(); its RFC 8785 bytes hash to "
                                           "content_hash")


class VersionOut(BaseModel):
    version: int
    content_hash: str
    cause: str
    published_by: str
    published_at: Any


class VersionPage(BaseModel):
    device: str
    items: list[VersionOut]
    next_before: int | None = Field(description="pass as `before` for the older versions; null: no more")


def node_name(principal: Principal) -> str:
    return principal.id.rsplit("/node/", 1)[1]


def _scope(request: Request, principal: Principal, device: str, action: str) -> None:
    """Authorize `action` (api_authz.rego), then confine a node to its own devices."""
    authorize(request, principal, action, None)
    if principal.role != "node":
        return
    name = device.split(":", 1)[1]
    if name == node_name(principal):
        return
    reason = f"out-of-scope: node {node_name(principal)} may only {action} its own devices, not {device}"
    log.warning("authorization denied: %s (%s)", reason, principal.id)
    log_denial(request, principal, action, device, reason)
    raise Forbidden(f"node {principal.id} may not {action}: {reason}")


def log_denial(request: Request, principal: Principal, action: str, device: str, reason: str) -> None:
    """An out-of-scope node request, kept in the decision log as a denied authorization."""
    from policy.decide import AuthzDecision
    from policy.decisionlog import DecisionLog

    ctx = request.app.state.ctx
    asked = {"principal": {"id": principal.id, "role": principal.role}, "action": action,
             "resource": {"device": device}}
    DecisionLog(ctx.db, clock=ctx.clock).record("authz", asked, AuthzDecision(False, [reason]), None,
                                                owner=principal.scope_tenant)  # a node: the operator's log


@router.get("/devices", response_model=list[DeviceOut], responses=READ_ERRORS,
            summary="Every device: desired vs applied version, pin, pending plan, drift, last apply, counters")
def list_devices(request: Request, ctx: CtxDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    authorize(request, principal, "device.read", None)
    if principal.role == "node":
        raise Forbidden("a node reads its own devices through GET /v1/devices/{device}/ruleset")
    with ctx.db.read_session() as session:
        return service.status_rows(session)


@router.get("/devices/{device}", response_model=DeviceOut, responses=READ_ERRORS,
            summary="One device: desired vs applied version, pin, pending plan, drift, last apply, counters")
def get_device(device: DevicePath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> dict[str, Any]:
    _scope(request, principal, device, "device.read")
    with ctx.db.read_session() as session:
        return service.status_row(session, device)


def _authorized(request: Request, ctx: Any, device: str) -> None:
    _scope(request, authenticate(request, ctx), device, "device.read")


def _current(ctx: Any, device: str) -> tuple[int, str, str, str, str]:
    with ctx.db.read_session() as session:
        st = service.get_state(session, device)
        if not st.in_fabric:
            raise NotFound(f"device {device} left the fabric (its last version was {st.version})")
        row = service.version_row(session, device, st.version)
        return row.version, row.content_hash, row.ir, row.cause, as_utc(row.created_at).isoformat()


def _matches(if_none_match: str | None, digest: str) -> bool:
    if not if_none_match:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return "*" in tags or any(t.removeprefix("W/").strip('"') == digest for t in tags)


@router.get("/devices/{device}/ruleset", response_model=None,
            responses={200: {"model": RuleSetOut, "description": "the desired rule set"},
                       304: {"description": "the device already has it (If-None-Match), or the wait ended"},
                       **READ_ERRORS},
            summary="A device's desired rule set: ETag, If-None-Match (304), long-poll with ?wait=")
@authenticated_in_thread
async def get_ruleset(
    device: DevicePath, request: Request, ctx: CtxDep,
    wait: Annotated[int, Query(ge=0, le=MAX_WAIT, description="with If-None-Match: seconds to wait for a newer "
                                                              "version before answering 304")] = 0,
    if_none_match: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    # The token checked and the device's scope authorized in a worker thread, before anything else (the token's
    # row is a database read, an out-of-scope node's denial a decision-log write): not on the event loop that
    # every long-polling agent's request waits on (an async route: its waits are the loop's, not a thread's)
    await in_worker(request, _authorized, request, ctx, device)
    watch = request.app.state.device_watch
    wait_for = float(min(wait, ctx.settings.device_wait_max_seconds))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_for
    async with watch.subscription(device) as event:  # before the read: no publication falls in between
        current = await in_worker(request, _current, ctx, device)
        while _matches(if_none_match, current[1]):
            remaining = deadline - loop.time()
            if remaining <= 0 or watch.closing:  # closing: the server is stopping, the agent asks the next one
                return Response(status_code=304, headers={"ETag": f'"{current[1]}"'})
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return Response(status_code=304, headers={"ETag": f'"{current[1]}"'})
            if watch.closing:
                return Response(status_code=304, headers={"ETag": f'"{current[1]}"'})
            event.clear()  # woken: read again (a wake for a version the device already has keeps waiting)
            current = await in_worker(request, _current, ctx, device)
    version, digest, ir, cause, published_at = current
    head = json.dumps({"device": device, "version": version, "content_hash": digest, "cause": cause,
                       "published_at": published_at}, separators=(",", ":"))
    body = head[:-1] + ',"ir":' + ir + "}"
    headers = {"ETag": f'"{digest}"', "Cache-Control": "no-cache"}
    if device.startswith("leaf:"):  # the agent applies at once when it holds this view (no second request)
        headers[VIEW_HEADER] = (await in_worker(request, _leaf_view, ctx, device))[1]
    return Response(content=body.encode(), media_type="application/json", headers=headers)


@router.get("/devices/{device}/versions", response_model=VersionPage, responses=READ_ERRORS,
            summary="A device's published rule-set versions, newest first: cause, publisher, time")
def list_versions(
    device: DevicePath, request: Request, ctx: CtxDep, principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[int | None, Query(ge=1, description="versions older than this one")] = None,
) -> dict[str, Any]:
    _scope(request, principal, device, "device.read")
    with ctx.db.read_session() as session:
        rows = service.versions(session, device, limit=limit + 1, before=before)
    return {"device": device, "items": rows[:limit],
            "next_before": rows[limit - 1]["version"] if len(rows) > limit else None}


@router.get("/devices/{device}/fabric", responses=READ_ERRORS,
            summary="A leaf's fabric view: tenants, cables and placed addresses its Linux realisation routes by")
def leaf_fabric(device: DevicePath, request: Request, ctx: CtxDep, principal: PrincipalDep) -> Response:
    _scope(request, principal, device, "device.read")
    if not device.startswith("leaf:"):
        raise NotFound(f"{device} is not a leaf: a SuperNIC's rule set is all its agent needs")
    view, digest = _leaf_view(ctx, device)
    return Response(content=json.dumps(view, separators=(",", ":")).encode(), media_type="application/json",
                    headers={"ETag": f'"{digest}"', "Cache-Control": "no-cache"})


def _leaf_view(ctx: Any, device: str) -> tuple[dict[str, Any], str]:
    """A leaf's fabric view and its hash (the ETag of GET .../fabric, the X-Fabric-View of its rule set)."""
    from enforcer.fabric_db import compile_fabric_of
    from enforcer.leaf_view import leaf_view, view_hash
    from workflows.context import trust_domain

    with ctx.db.read_session() as session:
        if not service.get_state(session, device).in_fabric:
            raise NotFound(f"device {device} is not in the fabric")
        view = leaf_view(compile_fabric_of(session, trust_domain(ctx, session)))
    return view, view_hash(view)


@router.post("/devices/{device}/status", response_model=StatusOut, responses=WRITE_ERRORS,
             summary="A device agent's report: applied version and hash, counters, drift, last error")
def report_status(device: DevicePath, body: StatusReport, request: Request, ctx: CtxDep,
                  principal: PrincipalDep) -> dict[str, Any]:
    _scope(request, principal, device, "device.report")
    with ctx.db.session() as session:
        recorded = service.record_status(session, device, body.model_dump(), actor=principal.actor(),
                                         now=ctx.clock(), request_id=request_id(request))
        return {**service.status_row(session, device), "stale": recorded.stale}

