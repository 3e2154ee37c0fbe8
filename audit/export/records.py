"""What every export format carries -- a header, events, gap records -- as its reader yields them, and
the writer protocol each format implements. Formats differ only in how these look on the page."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from audit.errors import Malformed, Oversized, Truncated

EXPORT_FORMAT = "trustfabric-audit-export"
EXPORT_VERSION = 1
# No export writes a longer line (events are at most MAX_EVENT_BYTES, an OCSF line a few times that;
# the header a few kB): readers stop at it with a verdict instead of reading a huge line whole.
MAX_LINE_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"  # what a spreadsheet puts before a CSV it saves


@dataclass
class Header:
    line: int
    fields: dict[str, Any]


@dataclass
class Event:
    line: int
    data: bytes  # the exact leaf input
    stated_leaf: str
    doc: dict[str, Any] | None  # parsed lazily where the format carries the bytes (JSONL)
    mapped_differs: bool = False  # a mapped format's own fields disagree with the signed event (OCSF)


@dataclass
class Gap:
    line: int
    level: int
    start: int
    hash: bytes


Record = Header | Event | Gap


class Writer(Protocol):
    """Writes one export in one format; the exporter calls header once, then events and gaps in order."""

    def header(self, header: dict[str, Any]) -> None:
        """The header record (checkpoint, range, filter)."""
        ...

    def event(self, data: str, leaf_hash: str) -> None:
        """One event: its exact hashed bytes (RFC 8785 JSON) and leaf hash."""
        ...

    def gap(self, level: int, start: int, node: bytes) -> None:
        """The hash of the complete subtree of `level` starting at leaf `start`, standing for its events."""
        ...

    def close(self) -> None:
        """Flush; the output stream stays open."""
        ...


@dataclass(frozen=True)
class Format:
    """One export format: a module holding its writer and its reader registers one of these."""

    name: str
    media_type: str
    extension: str
    writer: Callable[[IO[bytes], str], Writer]  # (output, checkpoint origin)
    reader: Callable[[IO[bytes]], Iterator[Record]]
    detects: Callable[[bytes], bool]  # whether a file whose first line is this is in the format


def compact(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def malformed(line: int, message: str, index: int | None = None) -> Malformed:
    return Malformed(f"line {line}: {message}", index=index, line=line)


def is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def gap_from(obj: Any, line: int) -> Gap:
    if not isinstance(obj, dict) or set(obj) != {"hash", "level", "start"}:
        raise malformed(line, "gap record needs exactly hash, level and start")
    level, start, h = obj["level"], obj["start"], obj["hash"]
    if type(level) is not int or type(start) is not int or not 0 <= level < 63 or start < 0 or not is_hex64(h):
        raise malformed(line, "gap record has a bad level, start or hash")
    return Gap(line, level, start, bytes.fromhex(h))


def lines(stream: IO[bytes], *, last_needs_newline: bool = True) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline), each read with a bound: a line longer than
    MAX_LINE_BYTES is Oversized, a last line without a newline (where one is needed) Truncated."""
    lineno = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        if not raw.endswith(b"\n"):
            if len(raw) > MAX_LINE_BYTES:
                raise Oversized(
                    f"line {lineno} is longer than {MAX_LINE_BYTES} bytes, which no export writes", line=lineno
                )
            if last_needs_newline:
                raise Truncated(f"line {lineno} is cut off: the file ends mid-record", line=lineno)
            yield lineno, raw
            return
        yield lineno, raw[:-1]


def json_lines(
    stream: IO[bytes], event: Callable[[int, bytes, str], Event | None]
) -> Iterator[Record]:
    """The reader of the JSON-lines formats: `event(line number, line, origin)` parses the format's
    event lines (None: not an event line); header and gap records are common to them."""
    origin = ""
    for lineno, line in lines(stream):
        ev = event(lineno, line, origin)
        if ev is not None:
            yield ev
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise malformed(lineno, f"not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise malformed(lineno, "record is not a JSON object")
        if set(obj) == {"gap"}:
            yield gap_from(obj["gap"], lineno)
        elif set(obj) == {"header"} and isinstance(obj["header"], dict):
            origin = str(obj["header"].get("origin", ""))
            yield Header(lineno, obj["header"])
        else:
            raise malformed(lineno, "unknown record")


def header_output(first_line: bytes) -> str | None:
    """The `output` a JSON-lines header names (None if the line is not such a header)."""
    try:
        header = json.loads(first_line)["header"]
    except (ValueError, KeyError, TypeError):
        return None
    output = header.get("output") if isinstance(header, dict) else None
    return output if isinstance(output, str) else None


def context_positions(flt: dict[str, Any], start: int, end: int, size: int) -> tuple[int | None, int | None]:
    """Sequence numbers of the context events an export of [start, end) carries: the event before the
    range when --since cut it, the event after it when --until did; None where there is none. Only for
    exports that do not narrow by tenant or action. Shared with the verifier."""
    if flt.get("tenant") is not None or flt.get("action") is not None:
        return None, None
    before = start - 1 if flt.get("since") is not None and start > 0 else None
    after = end if flt.get("until") is not None and end < size else None
    return before, after
