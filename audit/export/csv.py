"""CSV for spreadsheets: one row per record, the event's fields in columns from which the verifier
rebuilds the exact hashed bytes; header and gap rows use the `data`, `seq`, `level`, `hash` cells.
The `v` and `counters` columns (events of version 2) come after the first ones, then `actor_tenant` (the
actor's tenant, audit/actor.py; empty where the event has none): each added at the end, so a consumer reading
columns by position keeps reading the ones it knew. A file without them (written before they existed) is
read as the events of its time: without `v` and `counters`, version 1 events; without `actor_tenant`, actors
of no tenant.

Formula injection: a cell a spreadsheet would run as a formula (starting with `=`, `+`, `-`, `@`, a tab or a CR,
after any `'`) is written with one more `'` first, and the `formula_guard` column (last; its header-row cell names
the prefix) says so; the reader takes that `'` off again, so the hashed bytes rebuild exactly, and refuses a file
with the column in which such a cell lacks it (it would verify while the spreadsheet ran it). Callers choose text
that lands in cells (a reason, a request id, a token's subject): `=HYPERLINK(...)` in a revocation reason was a live
formula in the auditor's spreadsheet. A file without the column (written before) was never quoted: read verbatim."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import IO, Any

import rfc8785

from audit.actor import actor_document
from audit.errors import Malformed, Truncated
from audit.export.records import Event, Format, Header, Record, compact, gap_from, lines, malformed

V1_COLUMNS = (
    "record",
    "seq",
    "ts",
    "actor_id",
    "actor_kind",
    "tenant",
    "action",
    "object_type",
    "object_id",
    "summary",
    "reason",
    "request_id",
    "prev_hash",
    "leaf_hash",
    "level",
    "hash",
    "data",
)
V2_COLUMNS = (*V1_COLUMNS, "v", "counters")
V3_COLUMNS = (*V2_COLUMNS, "actor_tenant")
CSV_COLUMNS = (*V3_COLUMNS, "formula_guard")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
GUARD = "'"


UNGUARDED_CAUTION = (
    "this CSV was written before formula guarding (no formula_guard column): a cell starting with = + - @ may run as "
    "a formula in a spreadsheet; open it as text, or export it again")


def predates_guard(first_line: bytes) -> bool:
    """Whether a CSV export's header row lacks the formula_guard column: written before cells were guarded, so it
    verifies (its bytes are the hashed ones) while a spreadsheet may run its caller-chosen cells."""
    columns = next(csv.reader([first_line.decode("utf-8", "replace")]), [])
    return bool(columns) and columns[0] == "record" and "formula_guard" not in columns


def _runs_as_formula(cell: str) -> bool:
    """Whether a spreadsheet would run the cell, or it would after the quote the reader takes off (a cell the
    writer quoted, or one its author began with quotes): the writer quotes exactly these, the reader unquotes them."""
    return cell.lstrip(GUARD).startswith(FORMULA_START)


def guarded(cell: Any) -> Any:
    return GUARD + cell if isinstance(cell, str) and _runs_as_formula(cell) else cell


def unguarded(cell: str) -> str:
    return cell[1:] if cell.startswith(GUARD) and _runs_as_formula(cell) else cell


class CsvWriter:
    def __init__(self, out: IO[bytes], origin: str) -> None:
        self.out = out
        self.origin = origin
        self.text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        self.csv = csv.writer(self.text, lineterminator="\n")
        # QUOTE_MINIMAL quotes only the lineterminator's characters: a bare CR (a reason 'a\rb') went out unquoted,
        # which the reader (any CSV reader) takes for a line break, and the whole export failed to verify
        self.quoted = csv.writer(self.text, lineterminator="\n", quoting=csv.QUOTE_ALL)
        self.csv.writerow(CSV_COLUMNS)

    def _row(self, **cells: Any) -> None:
        row = ["" if cells.get(c) is None else guarded(cells[c]) for c in CSV_COLUMNS]
        carriage_return = any(isinstance(cell, str) and "\r" in cell for cell in row)
        (self.quoted if carriage_return else self.csv).writerow(row)

    def header(self, header: dict[str, Any]) -> None:
        self._row(record="header", data=compact(header).decode(), formula_guard=GUARD)

    def event(self, data: str, leaf_hash: str) -> None:
        doc = json.loads(data)
        self._row(
            record="event",
            seq=doc["seq"],
            ts=doc["ts"],
            actor_id=doc["actor"]["id"],
            actor_kind=doc["actor"]["kind"],
            actor_tenant=doc["actor"].get("tenant"),
            tenant=doc["tenant"],
            action=doc["action"],
            object_type=doc["object"]["type"],
            object_id=doc["object"]["id"],
            summary=compact(doc["summary"]).decode(),
            reason=doc["reason"],
            request_id=doc["request_id"],
            prev_hash=doc["prev_hash"],
            leaf_hash=leaf_hash,
            v=doc["v"],
            counters=compact(doc["counters"]).decode() if "counters" in doc else None,
        )

    def gap(self, level: int, start: int, node: bytes) -> None:
        self._row(record="gap", seq=start, level=level, hash=node.hex())

    def close(self) -> None:
        self.text.flush()
        self.text.detach()
        self.out.flush()


def _document(cell: dict[str, str]) -> dict[str, Any]:
    doc = {
        "v": int(cell.get("v") or 1),
        "seq": int(cell["seq"]),
        "ts": cell["ts"],
        "actor": actor_document(cell["actor_id"], cell["actor_kind"], cell.get("actor_tenant") or None),
        "tenant": cell["tenant"] or None,
        "action": cell["action"],
        "object": {"type": cell["object_type"], "id": cell["object_id"]},
        "summary": json.loads(cell["summary"]),
        "reason": cell["reason"] or None,
        "request_id": cell["request_id"] or None,
        "prev_hash": cell["prev_hash"],
    }
    if cell.get("counters"):
        doc["counters"] = json.loads(cell["counters"])
    return doc


def _text_lines(stream: IO[bytes]) -> Iterator[str]:
    """The file's lines as text, each read with the bound of records.lines (csv would read any line
    whole); a spreadsheet may save the last one without a newline."""
    for _lineno, line in lines(stream, last_needs_newline=False):
        yield line.decode("utf-8") + "\n"


def read_csv(stream: IO[bytes]) -> Iterator[Record]:
    reader = csv.reader(_text_lines(stream))
    try:
        first = next(reader, None)
        columns = tuple(first or ())
        if columns not in (CSV_COLUMNS, V3_COLUMNS, V2_COLUMNS, V1_COLUMNS):
            raise malformed(1, "CSV header row does not name the export's columns")
        for row in reader:
            lineno = reader.line_num
            if len(row) != len(columns):
                error = Truncated if len(row) < len(columns) else Malformed
                raise error(f"line {lineno}: CSV row has {len(row)} cells, want {len(columns)}", line=lineno)
            if "formula_guard" in columns:
                if any(_runs_as_formula(c) and not c.startswith(GUARD) for c in row):
                    # the writer guards every such cell: one without its guard rebuilt the hashed bytes all the same,
                    # and the file verified while a spreadsheet ran the cell
                    raise malformed(lineno, "a cell a spreadsheet would run as a formula is not guarded with '")
                row = [unguarded(c) for c in row]
            cell = dict(zip(columns, row, strict=True))
            kind = cell["record"]
            if kind == "header":
                try:
                    fields = json.loads(cell["data"])
                except ValueError as exc:
                    raise malformed(lineno, "header data is not JSON") from exc
                if not isinstance(fields, dict):
                    raise malformed(lineno, "header data is not a JSON object")
                yield Header(lineno, fields)
            elif kind == "gap":
                try:
                    level, start = int(cell["level"]), int(cell["seq"])
                except ValueError as exc:
                    raise malformed(lineno, "gap level/start is not a number") from exc
                yield gap_from({"hash": cell["hash"], "level": level, "start": start}, lineno)
            elif kind == "event":
                try:
                    doc = _document(cell)
                    data = bytes(rfc8785.dumps(doc))
                except Exception as exc:
                    raise malformed(lineno, f"event row cannot be rebuilt: {exc}") from exc
                yield Event(lineno, data, cell["leaf_hash"], doc)
            else:
                raise malformed(lineno, f"unknown record type {kind!r}")
    except (UnicodeDecodeError, csv.Error) as exc:
        raise Malformed(f"the file is not a well-formed CSV export: {exc}") from exc


FORMAT = Format(
    name="csv",
    media_type="text/csv",
    extension="csv",
    writer=CsvWriter,
    reader=read_csv,
    detects=lambda first: first.startswith(b"record,"),
)
