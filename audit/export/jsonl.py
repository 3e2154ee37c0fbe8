"""JSONL, the native format: one JSON object a line -- the header, each event as the exact bytes that
were hashed wrapped as `{"event":<bytes>,"leaf_hash":"<hex>"}`, and gap records. Writer and reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from audit.export.records import (
    Event,
    Format,
    Record,
    compact,
    header_output,
    is_hex64,
    json_lines,
    malformed,
)

EVENT_PREFIX = b'{"event":'
LEAF_INFIX = b',"leaf_hash":"'
EVENT_SUFFIX = b'"}\n'
SUFFIX_LEN = len(LEAF_INFIX) + 64 + 2  # ,"leaf_hash":"<64 hex>"}


class JsonlWriter:
    def __init__(self, out: IO[bytes], origin: str) -> None:
        self.out = out
        self.origin = origin

    def header(self, header: dict[str, Any]) -> None:
        self.out.write(b'{"header":' + compact(header) + b"}\n")

    def event(self, data: str, leaf_hash: str) -> None:
        self.out.write(EVENT_PREFIX + data.encode() + LEAF_INFIX + leaf_hash.encode() + EVENT_SUFFIX)

    def gap(self, level: int, start: int, node: bytes) -> None:
        self.out.write(b'{"gap":' + compact({"hash": node.hex(), "level": level, "start": start}) + b"}\n")

    def close(self) -> None:
        self.out.flush()


def _event(lineno: int, line: bytes, _origin: str) -> Event | None:
    """An event line in the export's exact form, its bytes taken as they are (no JSON parsing here)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    if len(line) < len(EVENT_PREFIX) + SUFFIX_LEN or line[-SUFFIX_LEN:-66] != LEAF_INFIX or not line.endswith(b'"}'):
        raise malformed(lineno, "event record is not in the export's exact form")
    leaf = line[-66:-2].decode("ascii", errors="replace")
    if not is_hex64(leaf):
        raise malformed(lineno, "event leaf_hash is not 64 lowercase hex digits")
    return Event(lineno, line[len(EVENT_PREFIX) : -SUFFIX_LEN], leaf, None)


def read_jsonl(stream: IO[bytes]) -> Iterator[Record]:
    return json_lines(stream, _event)


FORMAT = Format(
    name="jsonl",
    media_type="application/x-ndjson",
    extension="jsonl",
    writer=JsonlWriter,
    reader=read_jsonl,
    detects=lambda first: header_output(first) in ("jsonl", None) and first.startswith(b'{"header":'),
)
