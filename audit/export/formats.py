"""The one registry of export formats. A new format is one module holding its writer and its reader
(and its `FORMAT` entry) plus one line here; exporter, verifier, CLI and API all read this table."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any, Literal, get_args

from audit.export import csv, jsonl, ocsf
from audit.export.records import BOM, MAX_LINE_BYTES, Format, Record

FormatName = Literal["jsonl", "csv", "ocsf"]  # for typed signatures and the API schema

FORMATS: dict[str, Format] = {f.name: f for f in (jsonl.FORMAT, csv.FORMAT, ocsf.FORMAT)}
assert set(FORMATS) == set(get_args(FormatName)), "FormatName must list exactly the registered formats"


def detect(first_line: bytes) -> Format:
    """The format of a file from its first line; JSONL when none claims it (its reader then says why)."""
    for fmt in FORMATS.values():
        if fmt.name != "jsonl" and fmt.detects(first_line):
            return fmt
    return FORMATS["jsonl"]


def read(stream: IO[bytes], cautions: list[str] | None = None) -> Iterator[Record]:
    """The records, by the reader of the format the first line names (read, then put back; a byte order
    mark, which spreadsheets write before a CSV they save, is dropped). What the first line says a reader of the
    file should beware of, though it verifies, is appended to `cautions`."""
    first = stream.readline(MAX_LINE_BYTES + 1)
    if first.startswith(BOM):
        first = first[len(BOM) :]
    fmt = detect(first)
    if cautions is not None and fmt is csv.FORMAT and csv.predates_guard(first):
        cautions.append(csv.UNGUARDED_CAUTION)
    return fmt.reader(io.BufferedReader(_Prefixed(first, stream), buffer_size=1 << 20))


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
