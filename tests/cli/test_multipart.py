"""cli.remote.multipart splits the API's multipart/mixed export answer (written by the route's own `_multipart`) into
its files however the bytes arrive, and an answer cut anywhere before its closing boundary is refused."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.routes.audit import _multipart
from cli.remote.client import ApiError
from cli.remote.multipart import MultipartSplitter, boundary_of, filename_of

BOUNDARY = "tf-0123456789abcdef0123456789abcdef"
# file bodies made of what is hardest to tell from a delimiter: line breaks, dashes, the boundary's own prefix
PIECES = st.sampled_from([b"\r\n", b"\n", b"-", b"--", b"--tf-0123", b"\r\n--tf-", b"x", b"{\"event\":1}\n"])
BODY = st.lists(PIECES, max_size=40).map(b"".join)


def _answer(export: bytes, decisions: bytes) -> bytes:
    parts = [("text/csv", "audit-export.csv", io.BytesIO(export)),
             ("application/x-ndjson", "audit-export.decisions.jsonl", io.BytesIO(decisions))]
    return b"".join(_multipart(parts, BOUNDARY))


def _split(answer: bytes, sizes: list[int]) -> dict[str, bytes]:
    files: dict[str, io.BytesIO] = {}

    def start(headers: dict[str, str]) -> io.BytesIO:
        return files.setdefault(filename_of(headers) or "?", io.BytesIO())

    splitter = MultipartSplitter(BOUNDARY.encode(), start)
    at = 0
    for size in [*sizes, len(answer)]:
        splitter.feed(answer[at : at + size])
        at += size
    splitter.close()
    assert splitter.parts == len(files)
    return {name: f.getvalue() for name, f in files.items()}


@settings(max_examples=300, deadline=None)
@given(export=BODY, decisions=BODY, sizes=st.lists(st.integers(min_value=0, max_value=70), max_size=30))
def test_the_parts_come_out_whole_however_the_bytes_arrive(export: bytes, decisions: bytes, sizes: list[int]) -> None:
    got = _split(_answer(export, decisions), sizes)
    assert got == {"audit-export.csv": export, "audit-export.decisions.jsonl": decisions}


@settings(max_examples=100, deadline=None)
@given(export=BODY, decisions=BODY, data=st.data())
def test_an_answer_cut_before_its_closing_boundary_is_refused(export: bytes, decisions: bytes,
                                                              data: st.DataObject) -> None:
    answer = _answer(export, decisions)
    closing = answer.rindex(b"--\r\n")  # the `--` after the last delimiter ends the answer
    cut = data.draw(st.integers(min_value=0, max_value=closing + 1))
    with pytest.raises(ApiError):
        _split(answer[:cut], [])


def test_the_boundary_and_the_file_name_are_read_from_the_headers() -> None:
    assert boundary_of(f"multipart/mixed; boundary={BOUNDARY}") == BOUNDARY.encode()
    assert boundary_of(f'Multipart/Mixed;boundary="{BOUNDARY}"') == BOUNDARY.encode()
    assert boundary_of("application/x-ndjson") is None and boundary_of("multipart/mixed") is None
    assert filename_of({"content-disposition": 'attachment; filename="a.jsonl"'}) == "a.jsonl"
    assert filename_of({}) is None
    with pytest.raises(ApiError):  # headers that never end
        MultipartSplitter(b"b", lambda h: io.BytesIO()).feed(b"--b\r\n" + b"x" * 20000)
