"""audit.export.summary reads back what the exporter wrote, without the key: `audit download` reports the count
`audit export` reports from it, and refuses a file cut short before keeping it."""

from __future__ import annotations

import base64
import io

import pytest

from audit.errors import Malformed, Truncated, VerificationError
from audit.export import export_events
from audit.export.summary import summarize
from store.db import Database
from tests.audit.conftest import KeySigner, fill
from tests.audit.test_export import FILTERS


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "ocsf"])
def test_the_summary_counts_what_the_exporter_counted(sqlite_db: Database, signer: KeySigner, fmt: str) -> None:
    fill(sqlite_db, 90)
    for f in FILTERS:  # windows with context events (not counted), narrowed selections, nothing selected
        buf = io.BytesIO()
        result = export_events(sqlite_db, signer, buf, fmt=fmt, filters=f)
        got = summarize(io.BytesIO(buf.getvalue()))
        assert (got.events, got.gaps, got.tree_size, got.start, got.end) == (
            result.events, result.gaps, result.tree_size, result.start, result.end), f
        assert got.checkpoint == result.checkpoint.note and got.root_hash == result.checkpoint.root_hash
        assert got.root_hash == base64.b64decode(result.checkpoint.note.split("\n")[2]).hex()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "ocsf"])
def test_a_file_cut_at_any_line_is_refused(sqlite_db: Database, signer: KeySigner, fmt: str) -> None:
    """A body that ends early on a line boundary (an answer whose transfer completed, but short) is no export:
    every position of the tree is covered by an event or a gap hash, so the missing end shows."""
    fill(sqlite_db, 40)
    for f in FILTERS[:5]:
        buf = io.BytesIO()
        export_events(sqlite_db, signer, buf, fmt=fmt, filters=f)
        lines = buf.getvalue().splitlines(keepends=True)
        for cut in range(len(lines)):
            with pytest.raises(VerificationError) as caught:
                summarize(io.BytesIO(b"".join(lines[:cut])))
            assert isinstance(caught.value, Truncated | Malformed), (f, cut, caught.value)
    with pytest.raises(Malformed):
        summarize(io.BytesIO(b'{"decision": 1}\n'))
