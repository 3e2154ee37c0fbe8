"""Exports an auditor takes away: the verifiable audit export, optionally with the policy decision records
of the same selection, and the `audit.export` event that says who exported what. The API streams the
files back, the CLI writes them next to each other; both run `export_audit` (nothing is recorded unless
every file was written)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from audit import Actor, record
from audit.checkpoint import CheckpointWriter, audit_signer, ed25519_public_key, verify_checkpoint
from audit.checkpoint import log_origin as origin_of
from audit.export import ExportFilter, ExportResult, export_events
from policy.decisionlog import DecisionExportResult, export_decisions, export_filter
from workflows.context import AppContext, trust_domain


def log_origin(ctx: AppContext) -> str:
    """The checkpoint origin: the initialised trust domain's (settings only before init)."""
    with ctx.db.read_session() as session:
        return origin_of(trust_domain(ctx, session))


def checkpoint_writer(ctx: AppContext, *, floor: int = 0) -> CheckpointWriter:
    """The writer of signed checkpoints on the settings' schedule (the background job's, and the one
    GET /v1/audit/checkpoint runs first with `floor=1`, so it never waits on a zero interval)."""
    return CheckpointWriter(
        ctx.db, audit_signer(ctx.keystore), origin=log_origin(ctx),
        every_events=max(floor, ctx.settings.audit_checkpoint_every),
        every_seconds=max(floor, ctx.settings.audit_checkpoint_seconds), clock=ctx.clock,
    )


@dataclass(frozen=True)
class ExportOutcome:
    events: ExportResult
    decisions: DecisionExportResult | None


def check_filters(filters: ExportFilter, *, with_decisions: bool) -> None:
    """InvalidInput for a bad selection, before any file is opened (a bad filter writes nothing)."""
    filters.check()
    if with_decisions:
        export_filter(filters.since, filters.until, filters.tenant)


def export_audit(
    ctx: AppContext,
    out: IO[bytes],
    *,
    fmt: str,
    filters: ExportFilter,
    actor: Actor,
    decisions_out: IO[bytes] | None = None,
    file_names: tuple[str, str] | None = None,
    request_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    since_checkpoint: str | None = None,
) -> ExportOutcome:
    """Write the export (and the decision records when `decisions_out` is given), then record who exported
    what. `file_names` (export, decisions) are named in the event when the files have names (the CLI).
    `since_checkpoint` is a signed checkpoint note the auditor kept: the header then carries the RFC 6962
    consistency proof from it (a bad or foreign note is InvalidInput before anything is written)."""
    check_filters(filters, with_decisions=decisions_out is not None)
    signer = audit_signer(ctx.keystore)
    kept = verify_checkpoint(since_checkpoint, ed25519_public_key(signer)) if since_checkpoint else None
    result = export_events(
        ctx.db, signer, out, fmt=fmt, filters=filters, origin=log_origin(ctx), clock=ctx.clock,
        progress=progress, since_checkpoint=kept,
    )
    decisions = None
    if decisions_out is not None:
        decisions = export_decisions(
            ctx.db, decisions_out, since=filters.since, until=filters.until, tenant=filters.tenant, clock=ctx.clock
        )
    summary: dict[str, Any] = {"filter": filters.as_json()}
    if file_names is not None:
        summary["out"] = file_names[0]
    summary["tree_size"] = result.tree_size
    if file_names is None:
        summary["events"] = result.events
    if decisions is not None:
        described: dict[str, Any] = {"out": file_names[1]} if file_names is not None else {}
        summary["decisions"] = {**described, "count": decisions.count, "sha256": decisions.sha256}
    with ctx.db.session() as session:  # audited once the export exists: a failed one leaves no event
        record(
            session, actor=actor, action="audit.export", object_type="export", object_id=fmt,
            tenant=filters.tenant, summary=summary, request_id=request_id,
        )
    return ExportOutcome(result, decisions)
