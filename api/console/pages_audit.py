"""Auditor: the audit log explorer (filter by tenant, action, actor, time, each applied by the API; an
event with its Merkle inclusion proof checked against the latest signed checkpoint), exports with download,
the decision log.

The proof is checked here with the offline verifier's own functions (audit.checkpoint, audit.merkle):
the checkpoint's Ed25519 signature, the event's leaf hash recomputed from its fields, and the audit path
from that leaf to the signed root. The page names the key it checked against, for comparison with the
auditor's own copy of the audit public key.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response, StreamingResponse

from api.console.client import ApiError
from api.console.web import render, signed_in
from api.routes.audit import ACTION
from api.routes.common import encode_cursor
from audit import merkle
from audit.checkpoint import load_public_key, verifier_key, verify_checkpoint
from audit.errors import CheckpointError, ProofError
from audit.service import leaf_hash

router = APIRouter()
PAGE = 100
Opt = Annotated[str, Query(max_length=64)]
FORMATS = ("jsonl", "csv", "ocsf")
T = TypeVar("T")


def utc_param(value: str, name: str) -> str | None:
    """A datetime-local form value (read as UTC) or an ISO time -> ISO 8601 with an offset; ValueError."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name} is not a date and time (YYYY-MM-DDTHH:MM, UTC)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.isoformat()


def action_param(value: str) -> str | None:
    """An action filter as the API takes it; ValueError in words (the API's own reason is its pattern)."""
    if not value:
        return None
    if not (3 <= len(value) <= 64 and re.fullmatch(ACTION, value)):
        raise ValueError("action is an event name such as grant.approve or group.create: lowercase words "
                         "(letters, digits, - or _) joined by dots, at least two of them")
    return value


@router.get("/audit")
async def audit(request: Request, tenant: Opt = "", action: Opt = "",
                actor: Annotated[str, Query(max_length=576)] = "", since: Opt = "", until: Opt = "",
                cursor: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    session = await signed_in(request)

    async def read() -> dict[str, Any]:
        page: dict[str, Any] = await session.api.get(
            "/v1/audit/events", limit=PAGE, cursor=cursor, tenant=tenant or None, action=action_param(action),
            actor=actor.strip() or None, since=utc_param(since, "since"), until=utc_param(until, "until"))
        return page

    empty: dict[str, Any] = {"items": [], "next_cursor": None}
    page, problem, status = await filtered(read, empty)
    return render(request, session, "audit.html", status=status, events=page["items"],
                  next_cursor=page.get("next_cursor"), problem=problem, tenant=tenant, action=action, actor=actor,
                  since=since, until=until)


async def filtered(read: Callable[[], Awaitable[T]], empty: T) -> tuple[T, str | None, int]:
    """(answer, None, 200) of a filtered read; (empty, the problem, its status) when the filter itself is
    bad (a time that does not parse here, or the API's 400/422): shown beside the form. Other refusals
    (403, 404) propagate and become the error page."""
    try:
        return await read(), None, 200
    except ValueError as exc:
        return empty, str(exc), 400
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise
        return empty, exc.reason, exc.status


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def check_inclusion(event: dict[str, Any], checkpoint: dict[str, Any], proof: dict[str, Any] | None
                    ) -> list[tuple[str, bool, str]]:
    """The checks, in order, as (what, passed, detail); the first failure ends them."""
    steps: list[tuple[str, bool, str]] = []
    try:
        key = load_public_key(checkpoint["public_key"])
        cp = verify_checkpoint(checkpoint["note"], key, origin=checkpoint["origin"])
    except (CheckpointError, ValueError, KeyError) as exc:
        return [("checkpoint signature", False, str(exc))]
    steps.append(("checkpoint signature", True,
                  f"tree size {cp.size}, signed by {verifier_key(cp.origin, key)}"))
    document = {"v": event["v"], "seq": event["seq"], "ts": event["ts"], "actor": event["actor"],
                "tenant": event["tenant"], "action": event["action"], "object": event["object"],
                "summary": event["summary"], "reason": event["reason"], "request_id": event["request_id"],
                "prev_hash": event["prev_hash"]}
    if event.get("counters") is not None:  # hashed with the event since the log keeps per-key counters
        document["counters"] = event["counters"]
    leaf = leaf_hash(document)
    if leaf != event["leaf_hash"]:
        return [*steps, ("leaf hash", False, "the event's fields do not hash to its stated leaf hash")]
    steps.append(("leaf hash", True, f"SHA-256(0x00 || RFC 8785 event) = {leaf[:16]}…"))
    if proof is None:
        return [*steps, ("inclusion proof", False, f"event {event['seq']} is not covered by the latest signed "
                                                   f"checkpoint (size {cp.size}) yet; reload shortly")]
    try:
        if bytes.fromhex(leaf) != _b64(proof["leaf_hash"]) or proof["tree_size"] != cp.size:
            raise ProofError("the proof is for another leaf or another tree size")
        merkle.verify_inclusion(event["seq"], cp.size, bytes.fromhex(leaf), [_b64(h) for h in proof["proof"]],
                                cp.root)
    except (ProofError, ValueError) as exc:
        return [*steps, ("inclusion proof", False, str(exc))]
    steps.append(("inclusion proof", True, f"{len(proof['proof'])} hashes from the leaf to the signed root"))
    return steps


@router.get("/audit/events/{seq}")
async def event(request: Request, seq: int) -> Response:
    session = await signed_in(request)
    if seq < 0:
        raise ApiError(404, f"audit event {seq} not found")
    page = await session.api.get("/v1/audit/events", limit=1,
                                 cursor=encode_cursor(str(seq - 1)) if seq > 0 else None)
    if not page["items"] or page["items"][0]["seq"] != seq:
        raise ApiError(404, f"audit event {seq} not found (or not visible to you)")
    found = page["items"][0]
    checkpoint = await session.api.get("/v1/audit/checkpoint")
    proof = None
    if seq < checkpoint["size"]:
        proof = await session.api.get("/v1/audit/proof/inclusion", index=seq, tree_size=checkpoint["size"])
    steps = check_inclusion(found, checkpoint, proof)
    return render(request, session, "event.html", event=found, checkpoint=checkpoint, steps=steps,
                  verified=bool(steps) and all(ok for _what, ok, _detail in steps) and len(steps) == 3)


@router.get("/audit/export")
async def export_form(request: Request) -> Response:
    session = await signed_in(request)
    return render(request, session, "export.html", formats=FORMATS, problem=None)


@router.post("/audit/export")
async def export(request: Request, csrf: Annotated[str, Form(max_length=200)] = "",
                 format: Annotated[str, Form(max_length=8)] = "jsonl", tenant: Annotated[str, Form(max_length=63)] = "",
                 action: Annotated[str, Form(max_length=64)] = "", since: Annotated[str, Form(max_length=64)] = "",
                 until: Annotated[str, Form(max_length=64)] = "",
                 actor: Annotated[str, Form(max_length=576)] = "") -> Response:
    session = await signed_in(request, csrf=csrf, change=True)

    async def start() -> tuple[int, dict[str, str], AsyncIterator[bytes]] | None:
        body = {"format": format, "tenant": tenant or None, "action": action_param(action),
                "actor": actor.strip() or None, "since": utc_param(since, "since"), "until": utc_param(until, "until")}
        return await session.api.stream("POST", "/v1/audit/exports", body)

    streamed, problem, status = await filtered(start, None)
    if streamed is None:
        return render(request, session, "export.html", status=status, formats=FORMATS, problem=problem)
    _status, headers, chunks = streamed
    keep = {k: v for k, v in headers.items() if k in ("content-type", "content-disposition")}
    return StreamingResponse(chunks, headers=keep)


@router.get("/audit/public-key")
async def public_key(request: Request) -> Response:
    session = await signed_in(request)
    checkpoint = await session.api.get("/v1/audit/checkpoint")
    return Response(checkpoint["public_key"], media_type="application/x-pem-file",
                    headers={"Content-Disposition": 'attachment; filename="audit.pub"'})


@router.get("/decisions")
async def decisions(request: Request, kind: Opt = "", tenant: Opt = "", allowed: Opt = "", since: Opt = "",
                    until: Opt = "") -> Response:
    session = await signed_in(request)

    async def read() -> list[Any]:
        found: list[Any] = await session.api.get(
            "/v1/policy/decisions", kind=kind or None, tenant=tenant or None,
            allowed={"yes": True, "no": False}.get(allowed), since=utc_param(since, "since"),
            until=utc_param(until, "until"), limit=100)
        return found

    none: list[Any] = []
    rows, problem, status = await filtered(read, none)
    return render(request, session, "decisions.html", status=status, rows=rows, problem=problem, kind=kind,
                  tenant=tenant, allowed=allowed, since=since, until=until)
