"""Compliance exports (JSONL, CSV, OCSF), streamed with constant memory, each verifiable offline.

What an export carries so that an auditor needs nothing but the file and the audit public key:

1. a header with the signed checkpoint (tree size n, root) written at the start of the export;
2. every selected event, as the exact bytes that were hashed (JSONL) or fields that rebuild them;
3. for every position of the tree [0, n) not covered by a selected event, the hashes of the complete
   aligned subtrees that cover the gap ("gap" records, O(log n) per gap, from `audit_nodes`).

The verifier rebuilds the root of size n from events and gap hashes in order (a compact range,
O(log n) memory) and compares it with the signed checkpoint. Why this rather than one inclusion proof
per event: it costs nothing for a full export (no gaps at all), O(log n) for a time range, and for a
tenant or action filter at most O(log n) per run of excluded events -- never more than per-event
proofs (O(log n) each) -- and it also proves the *order* and *contiguity* of what is shown: an event
cannot be dropped from an unfiltered export, moved, or duplicated without the root changing.

A tenant or action filter hides events behind opaque gap hashes, so the root alone cannot show that no
matching event was hidden. Every event numbers itself per tenant, per action and per tenant+action
(audit/counters.py), and the header carries the signed head of the filter's key (its count at the
checkpoint, with an RFC 6962 proof into the checkpoint's counters root): the verifier then sees the
shown events numbered k, k+1, ... without a hole up to the signed count, or names what is missing.

A time filter selects the contiguous sequence range from the first event at or after `since` to the
last event before `until`, so the result of a time-only export has no gaps inside its range. Because the
header (range and filter) is not signed, a time-window export that does not narrow also carries the
two *context* events just outside its range: the one before it (time < since) and the one after it
(time >= until), when they exist. They lie outside `range` (consumers skip them) and prove to the
verifier that the window was not cut short: whoever shrinks the range must show, as context, an event
whose time lies inside the window. A narrowed time-window export carries, as context, the filter's
matching events just before and just after the window instead (its numbers continue theirs). Times
never go backwards from the first counted event on (audit/service.py), which is what makes an event
before the window (in time) also one before it in the log.

An actor filter (`actor`, `actor_tenant`: audit.actor.ActorQuery, as `audit events` reads them) narrows the same
way, but nothing numbers an actor's events: its export proves each event shown authentic, in its place and of that
actor, and cannot prove that none of the actor's events was left out behind a gap hash. It carries no counter
proof, and the verifier reports it unproven (never proven complete); for a provable selection, export by tenant
or action and look the actor up in the file.

With `since_checkpoint` (an earlier checkpoint an auditor kept), the header also carries the RFC 6962
consistency proof from that tree to this one.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from sqlalchemy import and_, func, select
from sqlmodel import Session

from audit import counters, merkle
from audit.actor import ActorQuery
from audit.checkpoint import DEFAULT_ORIGIN, Checkpoint, CheckpointSigner, checkpoint_proving
from audit.errors import InvalidAuditEvent
from audit.export.formats import FORMATS
from audit.export.records import EXPORT_FORMAT, EXPORT_VERSION, context_positions
from audit.models import AuditCheckpoint, AuditEvent
from audit.service import ACTION_RE, actor_filter, consistency_proof, format_ts, node_hashes, root_at
from core.clock import Clock, system_clock
from core.slugs import is_slug
from store.db import Database

_events = AuditEvent.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ExportFilter:
    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    action: str | None = None
    actor: str | None = None  # actor and actor_tenant: audit.actor.ActorQuery, as `audit events` reads them
    actor_tenant: str | None = None

    def check(self) -> None:
        """InvalidAuditEvent naming the bad filter by its field (the API's and the console's callers see it, not only
        the CLI's: no `--option` names); nothing is written for a bad filter."""
        for name, value in (("since", self.since), ("until", self.until)):
            if value is not None and value.tzinfo is None:
                raise InvalidAuditEvent(f"export: {name} must carry a timezone (e.g. 2026-01-01T00:00:00Z)")
        if self.since and self.until and self.since >= self.until:
            raise InvalidAuditEvent("export: since must be before until")
        if self.tenant is not None and not is_slug(self.tenant):
            raise InvalidAuditEvent(f"export: tenant {self.tenant!r} is not a DNS-label slug")
        if self.action is not None and not ACTION_RE.fullmatch(self.action):
            raise InvalidAuditEvent(f"export: action {self.action!r} is not an action like 'svid.issue'")
        if self.actors.given and (problem := self.actors.problem()) is not None:
            raise InvalidAuditEvent(f"export: {problem}")

    @property
    def actors(self) -> ActorQuery:
        return ActorQuery(self.actor, self.actor_tenant)

    @property
    def narrows(self) -> bool:
        """Whether events inside the sequence range may be left out (tenant, action or actor filter)."""
        return self.tenant is not None or self.action is not None or self.actors.given

    def as_json(self) -> dict[str, Any]:
        """The header's `filter`; the actor's parts only when given (an export without them is as before)."""
        return {
            "since": format_ts(self.since) if self.since else None,
            "until": format_ts(self.until) if self.until else None,
            "tenant": self.tenant,
            "action": self.action,
            **self.actors.as_json(),
        }


@dataclass(frozen=True)
class ExportResult:
    checkpoint: AuditCheckpoint
    tree_size: int
    start: int
    end: int
    events: int
    gaps: int


def seq_range(session: Session, size: int, filters: ExportFilter) -> tuple[int, int]:
    """[start, end) of sequence numbers covered by the time filter within the first `size` events."""
    conn = session.connection()
    start, end = 0, size
    # SQLite keeps times as UTC text without an offset: compare in UTC whatever zone the caller used.
    if filters.since is not None:
        since = filters.since.astimezone(UTC)
        first = conn.execute(
            select(func.min(_events.c.seq)).where(and_(_events.c.ts >= since, _events.c.seq < size))
        ).scalar()
        start = size if first is None else int(first)
    if filters.until is not None:
        until = filters.until.astimezone(UTC)
        last = conn.execute(
            select(func.max(_events.c.seq)).where(and_(_events.c.ts < until, _events.c.seq < size))
        ).scalar()
        end = 0 if last is None else int(last) + 1
    if end < start:
        end = start
    return start, end


def _matcher(filters: ExportFilter) -> Callable[[str | None, str, str, str | None], bool]:
    """Whether an event (tenant, action, actor id, actor tenant) is one the filter selects: built once per export."""
    tenant_, action_, actors = filters.tenant, filters.action, filters.actors
    by_actor = actors.given

    def matches(tenant: str | None, action: str, actor_id: str, actor_tenant: str | None) -> bool:
        return ((tenant_ is None or tenant == tenant_) and (action_ is None or action == action_)
                and (not by_actor or actors.matches(actor_id, actor_tenant)))

    return matches


def export_events(
    db: Database,
    signer: CheckpointSigner,
    out: IO[bytes],
    *,
    fmt: str = "jsonl",
    filters: ExportFilter | None = None,
    origin: str = DEFAULT_ORIGIN,
    clock: Clock = system_clock,
    progress: Callable[[int, int], None] | None = None,
    batch: int = 5000,
    since_checkpoint: Checkpoint | None = None,
) -> ExportResult:
    """Write a verifiable export to `out`; signs (or reuses) a checkpoint of the log as it is now.

    `progress(done, total)` is called every `batch` rows of the scanned sequence range.
    `since_checkpoint` (already verified by the caller) adds the consistency proof from it.
    """
    filters = filters or ExportFilter()
    filters.check()
    if fmt not in FORMATS:
        raise InvalidAuditEvent(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    # The counters prove a tenant or action selection complete; nothing counts an actor's events, so an export
    # narrowed to actors carries no count (the verifier then says it is unproven, never that it is complete).
    proven = None if filters.actors.given else counters.filter_dimension(filters.tenant, filters.action)
    cp, heads_proof = checkpoint_proving(db, signer, proven[1] if proven else None, origin=origin, clock=clock)
    n = cp.size
    writer = FORMATS[fmt].writer(out, origin)
    events = gaps = 0
    with db.read_session() as session:
        start, end = seq_range(session, n, filters)
        header: dict[str, Any] = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "origin": origin,
            "checkpoint": cp.note,
            "tree_size": n,
            "range": {"start": start, "end": end},
            "filter": filters.as_json(),
            "exported_at": format_ts(clock().astimezone(UTC)),
            "output": fmt,
            "hashing": "RFC 6962: leaf = SHA-256(0x00 || event bytes), node = SHA-256(0x01 || l || r)",
        }
        if heads_proof is not None:
            header["counters"] = heads_proof
        if since_checkpoint is not None:
            header["consistency"] = _consistency(session, since_checkpoint, n)
        writer.header(header)
        if filters.narrows:
            before, after = _narrowed_context(session, filters, start, end, n)
        else:
            before, after = context_positions(filters.as_json(), start, end, n)

        def stored_gap(lo: int, hi: int) -> None:
            nonlocal gaps
            for level, st, node in _stored_gap(session, lo, hi):
                writer.gap(level, st, node)
                gaps += 1

        def one_event(seq: int) -> None:
            for rows in _stream(session, seq, seq + 1, 1):
                for _seq, _tenant, _action, _actor_id, _actor_tenant, data, leaf in rows:
                    writer.event(data, leaf)

        if before is not None:
            stored_gap(0, before)
            one_event(before)
            stored_gap(before + 1, start)
        else:
            stored_gap(0, start)
        selected = _matcher(filters)
        left_out = merkle.CompactRange(start)  # the run of events since the last one shown
        total = end - start
        done = 0
        for rows in _stream(session, start, end, batch):
            for seq, tenant, action, actor_id, actor_tenant, data, leaf in rows:
                if selected(tenant, action, actor_id, actor_tenant):
                    for level, st, node in left_out.restart(seq + 1):
                        writer.gap(level, st, node)
                        gaps += 1
                    writer.event(data, leaf)
                    events += 1
                else:
                    left_out.append_leaf_hash(bytes.fromhex(leaf))
            done += len(rows)
            if progress is not None:
                progress(done, total)
        for level, st, node in left_out.nodes():
            writer.gap(level, st, node)
            gaps += 1
        if after is not None:
            stored_gap(end, after)
            one_event(after)
            stored_gap(after + 1, n)
        else:
            stored_gap(end, n)
    writer.close()
    return ExportResult(checkpoint=cp, tree_size=n, start=start, end=end, events=events, gaps=gaps)


def _narrowed_context(
    session: Session, filters: ExportFilter, start: int, end: int, size: int
) -> tuple[int | None, int | None]:
    """The matching events just outside a narrowed time window: the last before it (when --since cut
    it), the first after it (when --until did)."""
    match = []
    if filters.tenant is not None:
        match.append(_events.c.tenant == filters.tenant)
    if filters.action is not None:
        match.append(_events.c.action == filters.action)
    if filters.actors.given:
        match.append(actor_filter(filters.actor, filters.actor_tenant))
    conn = session.connection()
    before = after = None
    if filters.since is not None and start > 0:
        found = conn.execute(select(func.max(_events.c.seq)).where(and_(*match, _events.c.seq < start))).scalar()
        before = None if found is None else int(found)
    if filters.until is not None and end < size:
        found = conn.execute(
            select(func.min(_events.c.seq)).where(and_(*match, _events.c.seq >= end, _events.c.seq < size))
        ).scalar()
        after = None if found is None else int(found)
    return before, after


def _consistency(session: Session, kept: Checkpoint, size: int) -> dict[str, Any]:
    """The RFC 6962 consistency proof from a kept checkpoint to the tree of `size`; InvalidAuditEvent if
    the kept one is newer or not a state of this log."""
    if kept.size > size:
        raise InvalidAuditEvent(f"the kept checkpoint (tree size {kept.size}) is newer than this log's ({size})")
    if root_at(session, kept.size) != kept.root:
        raise InvalidAuditEvent(
            f"the kept checkpoint's root for tree size {kept.size} is not this log's: the log was rewritten "
            "since, or the checkpoint is from another log"
        )
    proof = consistency_proof(session, kept.size, size)
    return {"size": kept.size, "proof": [base64.b64encode(h).decode() for h in proof]}


def _stored_gap(session: Session, start: int, end: int) -> list[tuple[int, int, bytes]]:
    nodes = merkle.range_nodes(start, end)
    found = node_hashes(session, nodes)
    return [(lv, i << lv, found[(lv, i)]) for lv, i in nodes]


def _stream(session: Session, start: int, end: int, batch: int) -> Iterator[list[Any]]:
    """Rows (seq, tenant, action, actor_id, actor_tenant, data, leaf_hash) in order, through a server-side cursor on
    PostgreSQL."""
    if start >= end:
        return
    conn = session.connection().execution_options(yield_per=batch)
    ev = _events.c
    result = conn.execute(
        select(ev.seq, ev.tenant, ev.action, ev.actor_id, ev.actor_tenant, ev.data, ev.leaf_hash)
        .where(and_(_events.c.seq >= start, _events.c.seq < end))
        .order_by(_events.c.seq)
    )
    try:
        for part in result.partitions():
            yield list(part)
    finally:
        result.close()
