"""What an export file says about itself, read without the public key: its header's checkpoint, tree size and
range, and how many events and gap records it holds. For a client that received an export over the API (the
server's own count is not in the file): `audit download` reports what `audit export` reports from this, and
refuses a file that is not a whole export (cut short, malformed) before it is kept. It proves nothing: that is
`audit verify`'s work, with the key."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import IO, Any

from audit.errors import Malformed, Truncated
from audit.export.formats import read
from audit.export.records import Event, Gap, Header


@dataclass(frozen=True)
class ExportSummary:
    header: dict[str, Any]
    checkpoint: str  # the signed note, as the header carries it
    root_hash: str  # hex, as `audit export` prints it
    tree_size: int
    start: int
    end: int
    events: int  # inside [start, end): the context events beside a window are not counted, as the exporter counts
    gaps: int


def _int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise Malformed(f"the export header's {what} is not a count")
    return value


def _root(note: Any) -> str:
    """The root hash line of the checkpoint note (the third), as hex; not its signature's check."""
    lines = note.split("\n") if isinstance(note, str) else []
    try:
        root = base64.b64decode(lines[2], validate=True) if len(lines) > 2 else b""
    except binascii.Error:
        root = b""
    if len(root) != 32:
        raise Malformed("the export header's checkpoint is not a checkpoint note")
    return root.hex()


def summarize(stream: IO[bytes]) -> ExportSummary:
    """Read a whole export (any format, detected as `audit verify` detects it); Malformed, Truncated or Oversized
    (VerificationError) when it is no whole export."""
    try:
        return _summarize(stream)
    except UnicodeDecodeError as exc:
        raise Malformed(f"the file is not a well-formed export: {exc}") from exc


def _summarize(stream: IO[bytes]) -> ExportSummary:
    header: dict[str, Any] | None = None
    pos = events = gaps = 0
    start = end = 0
    for rec in read(stream):
        if isinstance(rec, Header):
            if header is not None:
                raise Malformed(f"line {rec.line}: a second header")
            header = rec.fields
            rng = header.get("range")
            if not isinstance(rng, dict):
                raise Malformed("the export header has no range")
            start, end = _int(rng.get("start"), "range start"), _int(rng.get("end"), "range end")
            continue
        if header is None:
            raise Malformed(f"line {rec.line}: the export does not begin with its header")
        if isinstance(rec, Gap):
            pos = rec.start + (1 << rec.level)
            gaps += 1
        elif isinstance(rec, Event):
            events += start <= pos < end
            pos += 1
    if header is None:
        raise Malformed("the file holds no export header")
    size = _int(header.get("tree_size"), "tree size")
    if pos != size:  # every export covers the whole tree [0, n) with events and gap hashes: its end is missing
        raise Truncated(f"the export covers the log up to position {pos} of {size}: it is cut short")
    return ExportSummary(
        header=header, checkpoint=str(header.get("checkpoint")), root_hash=_root(header.get("checkpoint")),
        tree_size=size, start=start, end=end, events=events, gaps=gaps,
    )
