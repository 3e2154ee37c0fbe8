"""Offline verification of an export: needs only the file and the audit public key.

`verify_export` runs these steps in order; the first failure raises one typed VerificationError
(audit.errors) naming its kind and the first bad event (its sequence number) or line:

0. fast pass -- an unfiltered JSONL export whose rebuilt root equals the signed one is proven whole
   (verify/fast.py); anything else, or any difference, goes through steps 1-6, which name the problem;
1. format -- the registry (export/formats.py) picks the reader from the first line;
2. checkpoint -- the signed note verifies with the audit public key (BadCheckpoint);
3. header -- it agrees with the checkpoint, and its unsigned range and filter cannot hide events
   (BadHeader, Removed, Truncated);
4. records, in order -- each gap covers exactly the next positions and hides nothing the export must
   show; each event hashes to its stated leaf, matches the filter, sits at its own position, chains to
   the event before it, is not earlier than the events before it, and a context event lies outside the
   time window (Modified, Removed, Reordered, Inserted, ChainBroken, OutsideFilter, TimeReversed,
   Malformed); every line is bounded (Oversized);
5. completeness -- the records reach the checkpoint's tree size (Truncated); a narrowed export's events
   carry the filter key's numbers without a hole, from its first event (or a context event before the
   window) to the count the checkpoint signs for that key (or a context event after it) (Removed,
   Truncated);
6. root -- the rebuilt RFC 6962 root equals the checkpoint root (RootMismatch);
7. kept checkpoint (optional) -- the export's tree extends an earlier checkpoint the auditor kept, by an
   RFC 6962 consistency proof or the rebuilt tree itself (StaleCheckpoint, Inconsistent).

All steps passed but a selection the log cannot prove complete (events or checkpoints from before the
log kept counters, an actor filter -- nothing counts an actor's events --, a context event from before its clock
was monotonic, no consistency proof) raises Unproven: never OK.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit import counters, merkle
from audit.actor import ActorQuery
from audit.errors import (
    BadCheckpoint,
    BadHeader,
    ChainBroken,
    CheckpointError,
    Inconsistent,
    Inserted,
    Malformed,
    Modified,
    OutsideFilter,
    ProofError,
    Removed,
    Reordered,
    RootMismatch,
    StaleCheckpoint,
    TimeReversed,
    Truncated,
    Unproven,
    VerificationError,
)
from audit.export.formats import read
from audit.export.records import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    Event,
    Gap,
    Header,
    Record,
    context_positions,
    malformed,
)
from audit.note import Checkpoint, verify_checkpoint
from audit.verify import fast as whole_file
from audit.verify.report import VerifyReport
from audit.wire import GENESIS_HASH


def verify_export(
    source: str | Path | IO[bytes],
    public_key: Ed25519PublicKey,
    *,
    fast: bool = True,
    since: Checkpoint | None = None,
) -> VerifyReport:
    """Verify an export file (JSONL, CSV or OCSF, detected); VerificationError at the first problem.
    `since`: a checkpoint the auditor kept (already verified), which the export's tree must extend."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return verify_export(fh, public_key, fast=fast, since=since)
    start = source.tell() if fast and since is None and source.seekable() else None
    if start is not None:  # step 0
        report = whole_file.verify_whole(source, public_key)
        if report is not None:
            return report
        source.seek(start)
    cautions: list[str] = []
    records = _Peekable(read(source, cautions))  # step 1: the format the first line names
    try:
        report = _verify_records(records, public_key, since)
    except Unproven as exc:
        exc.report = replace(exc.report, cautions=tuple(cautions))
        raise
    except UnicodeDecodeError as exc:
        raise Malformed(f"the file is not a well-formed export: {exc}") from exc
    return replace(report, cautions=tuple(cautions))


class _Peekable:
    def __init__(self, it: Iterator[Record]) -> None:
        self._it = it
        self._buf: list[Record] = []

    def __iter__(self) -> _Peekable:
        return self

    def __next__(self) -> Record:
        if self._buf:
            return self._buf.pop()
        return next(self._it)

    def peek(self) -> Record | None:
        if not self._buf:
            try:
                self._buf.append(next(self._it))
            except (StopIteration, VerificationError):
                return None
        return self._buf[-1]


# --- steps 2 and 3: checkpoint and header -------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    """What the (verified) header says the export shows."""

    cp: Checkpoint
    lo: int
    hi: int
    flt: dict[str, Any]
    tenant: str | None
    action: str | None
    since: datetime | None
    until: datetime | None
    before: int | None  # context events' positions (unknown ahead for a narrowed export)
    after: int | None
    key: tuple[str, str] | None  # (dimension, counter key) that proves a narrowed export complete
    head: counters.Head | None  # the key's head the checkpoint signs (None: it signs none)
    actors: ActorQuery | None = None  # an actor filter: narrows, and nothing counts its events

    @property
    def narrows(self) -> bool:
        return self.key is not None or self.actors is not None

    @property
    def shown(self) -> tuple[int, int]:
        """Positions [lo, hi) that must be shown as events (when the export does not narrow)."""
        return (self.lo if self.before is None else self.before, self.hi if self.after is None else self.after + 1)


def _check_checkpoint(header: dict[str, Any], public_key: Ed25519PublicKey) -> Checkpoint:
    """Step 2."""
    if header.get("format") != EXPORT_FORMAT or header.get("version") != EXPORT_VERSION:
        raise BadHeader(f"not a {EXPORT_FORMAT} version {EXPORT_VERSION} file")
    note = header.get("checkpoint")
    if not isinstance(note, str):
        raise BadHeader("the header carries no checkpoint")
    try:
        return verify_checkpoint(note, public_key)
    except CheckpointError as exc:
        raise BadCheckpoint(str(exc)) from exc


def _check_header(header: dict[str, Any], cp: Checkpoint) -> _Claim:
    """Step 3."""
    n = cp.size
    if header.get("tree_size") != n or header.get("origin") != cp.origin:
        raise BadHeader("header tree size or origin differ from the signed checkpoint")
    rng, flt = header.get("range"), header.get("filter")
    if not isinstance(rng, dict) or not isinstance(flt, dict):
        raise BadHeader("header lacks range or filter")
    lo, hi = rng.get("start"), rng.get("end")
    if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi <= n:
        raise BadHeader(f"header range {rng} is not within the tree of size {n}")
    # The range and filter are not signed: an export without --since must start at event 0 and one
    # without --until must reach the checkpoint's size, or whoever edited the header hid events behind
    # gap hashes (a cut tail, a cut head) while the root still matches.
    if flt.get("since") is None and lo != 0:
        raise Removed(f"the export has no --since, yet its range starts at event {lo}: events before it are hidden", 0)
    if flt.get("until") is None and hi != n:
        raise Truncated(
            f"the export has no --until, yet its range stops at event {hi} of the checkpoint's {n}: the tail is hidden",
            hi,
        )
    before, after = context_positions(flt, lo, hi, n)
    tenant, action = flt.get("tenant"), flt.get("action")
    actors = _actors(flt)
    key = None if actors is not None else counters.filter_dimension(tenant, action)
    head = None
    if key is not None and cp.counters is not None and "counters" in header:
        try:
            head = counters.verify_proof(header["counters"], key[1], cp.counters.keys, cp.counters.root)
        except ProofError as exc:
            raise BadHeader(f"the header's count of {key[1]!r} is not the one the checkpoint signs: {exc}") from exc
    return _Claim(
        cp, lo, hi, flt, tenant, action, _bound(flt, "since"), _bound(flt, "until"), before, after, key, head, actors
    )


def _actors(flt: dict[str, Any]) -> ActorQuery | None:
    """The header's actor filter (audit.actor.ActorQuery, as the export applied it), or None; BadHeader if bad."""
    query = ActorQuery(flt.get("actor"), flt.get("actor_tenant"))
    if not query.given:
        return None
    problem = query.problem()
    if problem is not None:
        raise BadHeader(f"the header's filter: {problem}")
    return query


def actor_unproven(actors: ActorQuery) -> str:
    """Why an export narrowed to actors cannot be proven complete (what `audit verify` and the export say)."""
    if actors.actor_tenant is None:
        who = f"actor {actors.actor}"
    elif actors.actor is None:
        who = f"the actors of tenant {actors.actor_tenant}"
    else:
        who = f"actor {actors.actor} of tenant {actors.actor_tenant}"
    return (f"the export is narrowed to {who}, and the log keeps no count of an actor's events: it cannot prove "
            "that none was left out (each event shown is proven authentic, in its place and that actor's; export "
            "by tenant or action for a selection proven complete)")


def _bound(flt: dict[str, Any], name: str) -> datetime | None:
    value = flt.get(name)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise BadHeader(f"the header's filter {name} {str(value)[:40]!r} is not a UTC time")
    return parsed


# --- step 4: the records ------------------------------------------------------------------------------


def _check_gap(rec: Gap, pos: int, claim: _Claim) -> None:
    if rec.start != pos:
        if rec.start > pos:
            raise Removed(f"event {pos} is missing (the next record starts at {rec.start})", pos, rec.line)
        raise Inserted(f"a gap record at line {rec.line} repeats position {rec.start}", rec.start, rec.line)
    width = 1 << rec.level
    if rec.start % width or rec.start + width > claim.cp.size:
        n = claim.cp.size
        raise malformed(rec.line, f"gap of level {rec.level} at {rec.start} is not an aligned subtree of {n}")
    show_lo, show_hi = claim.shown
    if not claim.narrows and rec.start < show_hi and rec.start + width > show_lo:
        first = max(rec.start, show_lo)
        what = "a context event of the time window" if first in (claim.before, claim.after) else "in the export's range"
        raise Removed(f"event {first} is {what} but hidden behind a gap hash", first, rec.line)


def _document(ev: Event, pos: int) -> dict[str, Any]:
    if ev.doc is None:
        try:
            ev.doc = json.loads(ev.data)
        except ValueError as exc:
            raise malformed(ev.line, f"event is not JSON ({exc})", index=pos) from exc
    doc = ev.doc
    if (
        not isinstance(doc, dict)
        or type(doc.get("seq")) is not int
        or not isinstance(doc.get("prev_hash"), str)
        or not isinstance(doc.get("action"), str)
        or not (doc.get("tenant") is None or isinstance(doc.get("tenant"), str))
    ):
        raise malformed(ev.line, "event lacks seq, prev_hash, action or tenant", index=pos)
    return doc


def _check_event(
    rec: Event, doc: dict[str, Any], leaf: bytes, pos: int, prev_leaf: bytes | None, claim: _Claim, records: _Peekable
) -> bool:
    """The checks of one event at position `pos`; returns whether it is a context event."""
    seq = doc["seq"]
    if leaf.hex() != rec.stated_leaf:
        raise Modified("its content does not hash to its recorded leaf hash (a field was changed)", seq, rec.line)
    if rec.mapped_differs:
        raise Modified("its OCSF fields differ from the signed event they carry", seq, rec.line)
    if claim.tenant is not None and doc["tenant"] != claim.tenant:
        raise OutsideFilter(
            f"it belongs to tenant {doc['tenant']!r} but the export is for tenant {claim.tenant!r}", seq, rec.line
        )
    if claim.action is not None and doc["action"] != claim.action:
        raise OutsideFilter(f"its action {doc['action']!r} is not the export's {claim.action!r}", seq, rec.line)
    if claim.actors is not None:
        actor = doc.get("actor")
        if not isinstance(actor, dict) or not isinstance(actor.get("id"), str) or not (
                actor.get("tenant") is None or isinstance(actor.get("tenant"), str)):
            raise malformed(rec.line, "event lacks its actor's id", index=pos)
        if not claim.actors.matches(actor["id"], actor.get("tenant")):
            shown = actor["id"] + (f"@{actor['tenant']}" if actor.get("tenant") is not None else "")
            raise OutsideFilter(f"its actor {shown!r} is not one the export selects ({claim.actors.as_json()})",
                                seq, rec.line)
    if pos >= claim.cp.size:
        raise Inserted(f"it lies beyond the checkpoint's tree size {claim.cp.size}", seq, rec.line)
    if claim.narrows:  # the matching event just before / after the window; step 5 checks it is that one
        is_context = (seq < claim.lo and claim.since is not None) or (seq >= claim.hi and claim.until is not None)
    else:  # (a context event out of place fails the position checks)
        is_context = seq in (claim.before, claim.after)
    if is_context and seq == pos:
        _check_context(doc, seq, claim, rec.line, before=seq < claim.lo)
    elif not is_context and not claim.lo <= seq < claim.hi:
        raise OutsideFilter(f"it lies outside the export's range [{claim.lo}, {claim.hi})", seq, rec.line)
    if seq != pos:
        _misplaced(seq, pos, rec, records)
    expected_prev = GENESIS_HASH if pos == 0 else (prev_leaf.hex() if prev_leaf is not None else None)
    if expected_prev is not None and doc["prev_hash"] != expected_prev:
        if pos == 0:
            raise ChainBroken("the first event does not start the chain", 0, rec.line)
        # This event is self-consistent (its bytes match its leaf hash), so the prev_hash it commits
        # to is what was recorded: the event before it is the one whose bytes changed.
        raise Modified(
            f"it no longer hashes to the prev_hash recorded by event {pos} (altered, leaf hash rewritten)",
            pos - 1,
            rec.line,
        )
    return is_context


def _misplaced(seq: int, pos: int, rec: Event, records: _Peekable) -> None:
    if seq > pos:
        nxt = records.peek()
        if isinstance(nxt, Event):
            try:
                nseq = _document(nxt, pos + 1)["seq"]
            except VerificationError:
                nseq = None
            if nseq == pos:
                raise Reordered(f"events {pos} and {seq} are out of order (swapped)", pos, rec.line)
        raise Removed(f"event {pos} is missing (the next event is {seq})", pos, rec.line)
    raise Inserted(
        f"a second event claims sequence number {seq} (at position {pos})", seq if seq == pos - 1 else pos, rec.line
    )


def _ts(doc: dict[str, Any], seq: int, line: int) -> datetime:
    try:
        ts = datetime.fromisoformat(str(doc.get("ts")).replace("Z", "+00:00"))
    except ValueError:
        ts = None
    if ts is None or ts.tzinfo is None:
        raise malformed(line, "event ts is not a UTC time", index=seq)
    return ts


def _check_context(doc: dict[str, Any], seq: int, claim: _Claim, line: int, *, before: bool) -> None:
    """A context event must lie outside the time window, or the range was cut short."""
    ts = _ts(doc, seq, line)
    if before and claim.since is not None and not ts < claim.since:
        raise Removed(
            f"it stands just before the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            seq,
            line,
        )
    if not before and claim.until is not None and not ts >= claim.until:
        raise Truncated(
            f"it stands just after the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            seq,
            line,
        )


class _Order:
    """Steps 4 and 5 across events: times never go backwards (from version 2 on), and a narrowed export's
    events carry the filter key's numbers without a hole. Collects what cannot be proven."""

    def __init__(self, claim: _Claim) -> None:
        self.claim = claim
        self.latest: datetime | None = None
        self.first: tuple[int, int, bool] | None = None  # (seq, number, is context) of the first matching
        self.last: tuple[int, int, bool, bytes] | None = None  # ... and of the last, with its leaf
        self.unproven: list[str] = [actor_unproven(claim.actors)] if claim.actors is not None else []

    def event(self, doc: dict[str, Any], seq: int, leaf: bytes, line: int, is_context: bool) -> None:
        ts = _ts(doc, seq, line)
        v2 = doc.get("v") == 2
        if v2 and self.latest is not None and ts < self.latest:
            raise TimeReversed(f"its time {doc['ts']} is earlier than an event before it", seq, line)
        self.latest = ts if self.latest is None else max(ts, self.latest)
        claim = self.claim
        if is_context and not v2:
            self.unproven.append(
                f"the context event {seq} predates the log's monotonic clock, so events before it in the log "
                "may lie inside the time window"
            )
        if claim.key is None:
            return
        dim, key = claim.key
        numbers = doc.get("counters")
        if not v2 or not isinstance(numbers, dict):
            self.unproven.append(f"event {seq} predates the per-key counters that prove a filtered export complete")
            return
        number = numbers.get(dim)
        if type(number) is not int or number < 0:
            raise malformed(line, f"event lacks its {dim} counter", index=seq)
        if self.last is not None and number != self.last[1] + 1:
            if number <= self.last[1]:
                raise Inserted(f"it repeats number {number} of {key!r}", seq, line)
            missing = f"#{self.last[1] + 1}" + (f"..#{number - 1}" if number - 1 > self.last[1] + 1 else "")
            raise Removed(
                f"{key!r} event(s) {missing} between events {self.last[0]} and {seq} are hidden behind gap hashes",
                seq,
                line,
            )
        if self.first is None:
            self.first = (seq, number, is_context)
        self.last = (seq, number, is_context, leaf)

    def finish(self) -> None:
        """Step 5 for a narrowed export: nothing before its first event, nothing after its last."""
        claim = self.claim
        if claim.key is None or self.unproven:
            return
        key = claim.key[1]
        counted_from = claim.cp.counters.counted_from if claim.cp.counters is not None else None
        if claim.head is None or counted_from is None:
            self.unproven.append(f"the checkpoint signs no count of {key!r} (written before the log kept counters)")
            return
        if self.first is None:
            if claim.head.count:
                raise Removed(
                    f"the checkpoint counts {claim.head.count} {key!r} event(s) but the export shows none", None
                )
        elif not self.first[2] and self.first[1] != 0:
            raise Removed(
                f"{key!r} events #0..#{self.first[1] - 1} come before the export's first one and are not shown "
                "(nor the one just before its window)",
                self.first[0],
            )
        if (self.first is None or not self.first[2]) and counted_from > 0:
            self.unproven.append(
                f"events before {counted_from} carry no counters, so none of them can be proven not to be {key!r}'s"
            )
        if self.last is not None and not self.last[2]:
            seq, number, _ctx, leaf = self.last
            if number + 1 < claim.head.count:
                raise Truncated(
                    f"the checkpoint counts {claim.head.count} {key!r} event(s) but the export stops at #{number} "
                    "(nor shows the one just after its window)",
                    seq,
                )
            if number + 1 > claim.head.count or leaf.hex() != claim.head.last:
                raise Modified(f"it is not the last {key!r} event the checkpoint signs", seq)


def _check_kept(kept: Checkpoint, cp: Checkpoint, kept_root_here: bytes | None, header: dict[str, Any]) -> str | None:
    """Step 7: the export's tree extends the kept one; returns why it cannot be proven, if so."""
    if kept.origin != cp.origin:
        raise Inconsistent(f"the kept checkpoint is of log {kept.origin!r}, the export of {cp.origin!r}")
    if kept.size > cp.size or (kept.time is not None and cp.time is not None and cp.time < kept.time):
        raise StaleCheckpoint(
            f"the export's checkpoint (tree size {cp.size}, signed {cp.time or 'at an unknown time'}) is older than "
            f"the one you kept (tree size {kept.size}, signed {kept.time or 'at an unknown time'})"
        )
    if kept_root_here is not None:
        if kept_root_here != kept.root:
            raise Inconsistent(f"the export's first {kept.size} events are not the tree of the kept checkpoint")
        return None
    proof = header.get("consistency")
    if not isinstance(proof, dict) or proof.get("size") != kept.size:
        return (
            f"the export carries no consistency proof from tree size {kept.size} "
            "(export it again with --since-checkpoint)"
        )
    try:
        hashes = [base64.b64decode(h, validate=True) for h in proof.get("proof", [])]
        merkle.verify_consistency(kept.size, cp.size, kept.root, cp.root, hashes)
    except (ProofError, binascii.Error, TypeError) as exc:
        raise Inconsistent(f"the export's tree does not extend the kept checkpoint's: {exc}") from exc
    return None


def _verify_records(records: _Peekable, public_key: Ed25519PublicKey, since: Checkpoint | None) -> VerifyReport:
    header = next(records, None)
    if not isinstance(header, Header):
        raise BadHeader("the export does not start with a header record")
    cp = _check_checkpoint(header.fields, public_key)  # step 2
    claim = _check_header(header.fields, cp)  # step 3
    order = _Order(claim)
    tree = merkle.CompactRange()
    kept_root = merkle.EMPTY_ROOT if since is not None and since.size == 0 else None
    prev_leaf: bytes | None = None  # hash of the event at pos-1 when that record was an event
    events = gaps = 0
    for rec in records:  # step 4
        pos = tree.end
        if isinstance(rec, Gap):
            _check_gap(rec, pos, claim)
            try:
                tree.append_node(rec.level, rec.hash)
            except ProofError as exc:
                raise malformed(rec.line, str(exc)) from exc
            prev_leaf = None
            gaps += 1
        elif isinstance(rec, Header):
            raise malformed(rec.line, "a second header in the middle of the export")
        else:
            leaf = merkle.hash_leaf(rec.data)
            doc = _document(rec, pos)
            is_context = _check_event(rec, doc, leaf, pos, prev_leaf, claim, records)
            order.event(doc, pos, leaf, rec.line, is_context)
            tree.append_leaf_hash(leaf)
            prev_leaf = leaf
            events += 0 if is_context else 1
        if since is not None and tree.end == since.size:
            kept_root = tree.root()
    if tree.end < cp.size:  # step 5
        raise Truncated(f"the export stops at event {tree.end} but the checkpoint covers {cp.size} events", tree.end)
    order.finish()
    if tree.root() != cp.root:  # step 6
        raise RootMismatch(
            "the events do not rebuild the signed checkpoint root: events were altered and their hashes recomputed"
        )
    unproven = order.unproven
    if since is not None:  # step 7
        reason = _check_kept(since, cp, kept_root, header.fields)
        unproven += [reason] if reason else []
    report = VerifyReport(cp.origin, cp.size, cp.root, events, gaps, (claim.lo, claim.hi), dict(claim.flt), cp.time)
    if unproven:
        raise Unproven("; ".join(dict.fromkeys(unproven)), report)
    return report
