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
   the event before it, and a context event lies outside the time window (Modified, Removed, Reordered,
   Inserted, ChainBroken, OutsideFilter, Malformed);
5. completeness -- the records reach the checkpoint's tree size (Truncated);
6. root -- the rebuilt RFC 6962 root equals the checkpoint root (RootMismatch).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit import merkle
from audit.checkpoint import Checkpoint, verify_checkpoint
from audit.errors import (
    BadCheckpoint,
    BadHeader,
    ChainBroken,
    CheckpointError,
    Inserted,
    Malformed,
    Modified,
    OutsideFilter,
    ProofError,
    Removed,
    Reordered,
    RootMismatch,
    Truncated,
    VerificationError,
)
from audit.export.formats import detect
from audit.export.records import EXPORT_FORMAT, EXPORT_VERSION, Event, Gap, Header, Record, malformed
from audit.export.stream import context_positions
from audit.service import GENESIS_HASH
from audit.verify import fast as whole_file
from audit.verify.report import VerifyReport


def verify_export(source: str | Path | IO[bytes], public_key: Ed25519PublicKey, *, fast: bool = True) -> VerifyReport:
    """Verify an export file (JSONL, CSV or OCSF, detected); VerificationError at the first problem."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return verify_export(fh, public_key, fast=fast)
    start = source.tell() if fast and source.seekable() else None
    if start is not None:  # step 0
        report = whole_file.verify_whole(source, public_key)
        if report is not None:
            return report
        source.seek(start)
    records = _Peekable(_read(source))  # step 1
    try:
        return _verify_records(records, public_key)
    except UnicodeDecodeError as exc:
        raise Malformed(f"the file is not a well-formed export: {exc}") from exc


# --- step 1: the format -------------------------------------------------------------------------------


def _read(stream: IO[bytes]) -> Iterator[Record]:
    """The records, by the reader of the format the first line names (read, then put back)."""
    first = stream.readline()
    return detect(first).reader(io.BufferedReader(_Prefixed(first, stream), buffer_size=1 << 20))


class _Prefixed(io.RawIOBase):
    """A stream with some already-read bytes put back in front (format detection without seek)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


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
    before: int | None  # context events' positions
    after: int | None

    @property
    def narrows(self) -> bool:
        return self.tenant is not None or self.action is not None

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
    return _Claim(
        cp, lo, hi, flt, flt.get("tenant"), flt.get("action"), _bound(flt, "since"), _bound(flt, "until"), before, after
    )


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
    if pos >= claim.cp.size:
        raise Inserted(f"it lies beyond the checkpoint's tree size {claim.cp.size}", seq, rec.line)
    is_context = seq in (claim.before, claim.after)  # (a context event out of place fails the position checks)
    if is_context and seq == pos:
        _check_context(doc, seq, claim, rec.line)
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


def _check_context(doc: dict[str, Any], seq: int, claim: _Claim, line: int) -> None:
    """A context event must lie outside the time window, or the range was cut short."""
    try:
        ts = datetime.fromisoformat(str(doc.get("ts")).replace("Z", "+00:00"))
    except ValueError:
        raise malformed(line, "event ts is not a time", index=seq) from None
    if seq == claim.before and claim.since is not None and not ts < claim.since:
        raise Removed(
            f"it stands just before the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            seq,
            line,
        )
    if seq != claim.before and claim.until is not None and not ts >= claim.until:
        raise Truncated(
            f"it stands just after the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            seq,
            line,
        )


def _verify_records(records: _Peekable, public_key: Ed25519PublicKey) -> VerifyReport:
    header = next(records, None)
    if not isinstance(header, Header):
        raise BadHeader("the export does not start with a header record")
    cp = _check_checkpoint(header.fields, public_key)  # step 2
    claim = _check_header(header.fields, cp)  # step 3
    tree = merkle.CompactRange()
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
            continue
        if isinstance(rec, Header):
            raise malformed(rec.line, "a second header in the middle of the export")
        leaf = merkle.hash_leaf(rec.data)
        is_context = _check_event(rec, _document(rec, pos), leaf, pos, prev_leaf, claim, records)
        tree.append_leaf_hash(leaf)
        prev_leaf = leaf
        events += 0 if is_context else 1
    if tree.end < cp.size:  # step 5
        raise Truncated(f"the export stops at event {tree.end} but the checkpoint covers {cp.size} events", tree.end)
    if tree.root() != cp.root:  # step 6
        raise RootMismatch(
            "the events do not rebuild the signed checkpoint root: events were altered and their hashes recomputed"
        )
    return VerifyReport(cp.origin, cp.size, cp.root, events, gaps, (claim.lo, claim.hi), dict(claim.flt))
