"""The offline verifier names the first bad event and what is wrong, for every tamper case."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import merkle
from audit.checkpoint import sign_checkpoint
from audit.errors import Oversized, VerificationError
from audit.export import ExportFilter, export_events
from audit.verify import verify_export
from audit.verify.fast import verify_whole as _fast_jsonl
from store.db import Database
from tests.audit.conftest import T0, KeySigner, fill

N = 100


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes | KeySigner]:
    from store.db import sqlite_url
    from workflows.schema import migrate

    db = Database(sqlite_url(tmp_path_factory.mktemp("verify")))
    migrate(db.engine)
    fill(db, N)
    signer = KeySigner()
    out: dict[str, bytes | KeySigner] = {"signer": signer}
    for name, fmt, flt in [
        ("jsonl", "jsonl", ExportFilter()),
        ("acme", "jsonl", ExportFilter(tenant="acme")),
        ("csv", "csv", ExportFilter()),
        ("ocsf", "ocsf", ExportFilter()),
        ("window", "jsonl", ExportFilter(since=T0 + timedelta(seconds=30), until=T0 + timedelta(seconds=60))),
    ]:
        buf = io.BytesIO()
        export_events(db, signer, buf, fmt=fmt, filters=flt)
        out[name] = buf.getvalue()
    db.dispose()
    return out


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _event_line(lines: list[bytes], seq: int) -> int:
    for i, line in enumerate(lines):
        if line.startswith(b'{"event":') and json.loads(line)["event"]["seq"] == seq:
            return i
    raise AssertionError(f"no event {seq}")


def _rehash(doc: dict[str, Any]) -> bytes:
    import rfc8785

    data = bytes(rfc8785.dumps(doc))
    return b'{"event":' + data + b',"leaf_hash":"' + merkle.hash_leaf(data).hex().encode() + b'"}\n'


def _verify(data: bytes, signer: KeySigner) -> VerificationError:
    with pytest.raises(VerificationError) as info:
        verify_export(io.BytesIO(data), signer.public_key())
    with pytest.raises(VerificationError) as slow:  # the detailed pass alone reaches the same verdict
        verify_export(io.BytesIO(data), signer.public_key(), fast=False)
    assert (slow.value.kind, slow.value.index) == (info.value.kind, info.value.index)
    return info.value


def _case(exported: dict[str, bytes | KeySigner], name: str,
          edit: Callable[[list[bytes]], object]) -> VerificationError:
    """`edit` changes the export's lines in place; what it returns (a popped line, say) is not used."""
    data, signer = exported[name], exported["signer"]
    assert isinstance(data, bytes) and isinstance(signer, KeySigner)
    lines = _lines(data)
    edit(lines)
    return _verify(b"".join(lines), signer)


def test_untouched_exports_verify(exported: dict[str, bytes | KeySigner], tmp_path: Path) -> None:
    signer = exported["signer"]
    assert isinstance(signer, KeySigner)
    want = {"acme": sum(1 for i in range(N) if i % 5 and i % 3 == 0), "window": 30}
    for name in ("jsonl", "acme", "csv", "ocsf", "window"):
        path = tmp_path / name
        path.write_bytes(exported[name])  # type: ignore[arg-type]
        report = verify_export(path, signer.public_key())
        assert report == verify_export(path, signer.public_key(), fast=False)  # both passes agree
        assert report.tree_size == N
        assert report.events == want.get(name, N)


def test_modified_field(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 37)
        lines[i] = lines[i].replace(b'"id":"obj-37"', b'"id":"obj-73"')

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("modified", 37)


def test_modified_field_with_its_leaf_hash_rewritten(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 37)
        doc = json.loads(lines[i])["event"]
        doc["reason"] = "nothing to see here"
        lines[i] = _rehash(doc)

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("modified", 37)


def test_whole_chain_rewritten_after_a_change_fails_the_signed_root(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        prev = None
        for i in range(_event_line(lines, 37), len(lines)):
            doc = json.loads(lines[i])["event"]
            if doc["seq"] == 37:
                doc["tenant"] = "umbrella"
            if prev is not None:
                doc["prev_hash"] = prev
            lines[i] = _rehash(doc)
            prev = json.loads(lines[i])["leaf_hash"]

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("root_mismatch", None)


def test_removed_event(exported: dict[str, bytes | KeySigner]) -> None:
    err = _case(exported, "jsonl", lambda lines: lines.pop(_event_line(lines, 50)))
    assert (err.kind, err.index) == ("removed", 50)


def test_removed_event_hidden_behind_a_gap_hash(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 30)
        leaf = json.loads(lines[i])["leaf_hash"]
        lines[i] = json.dumps({"gap": {"hash": leaf, "level": 0, "start": 30}}).encode() + b"\n"

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("removed", 30)


def test_two_events_swapped(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 20)
        lines[i], lines[i + 1] = lines[i + 1], lines[i]

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("reordered", 20)


def test_inserted_event(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 60)
        forged = json.loads(lines[i])["event"]
        forged["object"]["id"] = "backdoor"  # well formed: right seq, right prev_hash, right leaf hash
        lines.insert(i, _rehash(forged))

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("inserted", 60)


def test_event_appended_after_the_checkpoint(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        last = json.loads(lines[-1])
        doc = last["event"]
        doc["seq"], doc["prev_hash"] = N, last["leaf_hash"]
        lines.append(_rehash(doc))

    err = _case(exported, "jsonl", edit)
    assert (err.kind, err.index) == ("inserted", N)


def test_truncated_tail(exported: dict[str, bytes | KeySigner]) -> None:
    err = _case(exported, "jsonl", lambda lines: lines.__delitem__(slice(-5, None)))
    assert (err.kind, err.index) == ("truncated", N - 5)


def test_file_cut_mid_record(exported: dict[str, bytes | KeySigner]) -> None:
    data = exported["jsonl"]
    assert isinstance(data, bytes)
    err = _verify(data[:-40], exported["signer"])  # type: ignore[arg-type]
    assert err.kind == "truncated"


def _hide_behind_gaps(lines: list[bytes], keep: Callable[[int], bool], start: int, end: int) -> None:
    """Replace the events that `keep` rejects by gap records of their (true) leaf hashes and shrink the
    header's range to [start, end): the root still matches the signed checkpoint."""
    header = json.loads(lines[0])
    header["header"]["range"] = {"start": start, "end": end}
    lines[0] = json.dumps(header).encode() + b"\n"
    for i in range(1, len(lines)):
        rec = json.loads(lines[i])
        if not keep(rec["event"]["seq"]):
            gap = {"hash": rec["leaf_hash"], "level": 0, "start": rec["event"]["seq"]}
            lines[i] = json.dumps({"gap": gap}).encode() + b"\n"


def test_tail_hidden_behind_gaps_with_the_header_range_shrunk(exported: dict[str, bytes | KeySigner]) -> None:
    """The header is not signed: cutting the range short must not turn a truncated tail into a valid export."""
    err = _case(exported, "jsonl", lambda lines: _hide_behind_gaps(lines, lambda seq: seq < N - 5, 0, N - 5))
    assert (err.kind, err.index) == ("truncated", N - 5)


def test_head_hidden_behind_gaps_with_the_header_range_shrunk(exported: dict[str, bytes | KeySigner]) -> None:
    err = _case(exported, "jsonl", lambda lines: _hide_behind_gaps(lines, lambda seq: seq >= 3, 3, N))
    assert (err.kind, err.index) == ("removed", 0)


def _to_gap(line: bytes) -> bytes:
    rec = json.loads(line)
    return json.dumps({"gap": {"hash": rec["leaf_hash"], "level": 0, "start": rec["event"]["seq"]}}).encode() + b"\n"


def _set_range(lines: list[bytes], start: int, end: int) -> None:
    header = json.loads(lines[0])
    header["header"]["range"] = {"start": start, "end": end}
    lines[0] = json.dumps(header).encode() + b"\n"


def test_time_window_export_carries_its_context_events(exported: dict[str, bytes | KeySigner]) -> None:
    lines = _lines(exported["window"])  # type: ignore[arg-type]
    assert json.loads(lines[0])["header"]["range"] == {"start": 30, "end": 60}
    shown = [json.loads(line)["event"]["seq"] for line in lines if line.startswith(b'{"event":')]
    assert shown == list(range(29, 61))  # 29 and 60 lie outside the window: they prove where it ends


def test_time_window_cut_short_at_its_start(exported: dict[str, bytes | KeySigner]) -> None:
    """Events 30-32 hidden behind gaps and the (unsigned) range moved to start at 33."""

    def edit(lines: list[bytes]) -> None:
        _set_range(lines, 33, 60)
        for seq in (29, 30, 31):
            i = _event_line(lines, seq)
            lines[i] = _to_gap(lines[i])

    err = _case(exported, "window", edit)
    assert (err.kind, err.index) == ("removed", 32)  # event 32 is no context: its time is inside the window


def test_time_window_cut_short_at_its_end(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        _set_range(lines, 30, 57)
        for seq in (58, 59, 60):
            i = _event_line(lines, seq)
            lines[i] = _to_gap(lines[i])

    err = _case(exported, "window", edit)
    assert (err.kind, err.index) == ("truncated", 57)


def test_time_window_context_event_hidden(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = _event_line(lines, 60)
        lines[i] = _to_gap(lines[i])

    err = _case(exported, "window", edit)
    assert (err.kind, err.index) == ("removed", 60)


def _swap_checkpoint(lines: list[bytes], change: Callable[[str], str]) -> None:
    header = json.loads(lines[0])
    header["header"]["checkpoint"] = change(header["header"]["checkpoint"])
    lines[0] = json.dumps(header).encode() + b"\n"


def test_forged_checkpoint(exported: dict[str, bytes | KeySigner]) -> None:
    def forge(note: str) -> str:
        origin, size, _root, rest = note.split("\n", 3)
        return "\n".join([origin, size, base64.b64encode(hashlib.sha256(b"forged").digest()).decode(), rest])

    err = _case(exported, "jsonl", lambda lines: _swap_checkpoint(lines, forge))
    assert (err.kind, err.index) == ("checkpoint", None)
    assert "altered" in str(err)


def test_resigned_checkpoint(exported: dict[str, bytes | KeySigner]) -> None:
    """An attacker with database access rebuilds everything and signs with a key of their own."""

    def resign(note: str) -> str:
        origin, size, root = note.split("\n")[:3]
        return sign_checkpoint(KeySigner(), origin, int(size), base64.b64decode(root))

    err = _case(exported, "jsonl", lambda lines: _swap_checkpoint(lines, resign))
    assert (err.kind, err.index) == ("checkpoint", None)
    assert "not signed by the given audit public key" in str(err)


def test_tenant_export_with_another_tenants_event_slipped_in(exported: dict[str, bytes | KeySigner]) -> None:
    full = _lines(exported["jsonl"])  # type: ignore[arg-type]
    foreign = full[_event_line(full, 4)]  # event 4 belongs to globex
    assert json.loads(foreign)["event"]["tenant"] == "globex"

    def edit(lines: list[bytes]) -> None:
        at = next(i for i, line in enumerate(lines) if b'"start":4' in line or b'"seq":6,' in line)
        lines.insert(at, foreign)

    err = _case(exported, "acme", edit)
    assert (err.kind, err.index) == ("outside_filter", 4)


def test_tenant_export_with_the_filter_widened_in_the_header(exported: dict[str, bytes | KeySigner]) -> None:
    """Claiming the tenant export is unfiltered exposes its gaps as hidden events."""

    def edit(lines: list[bytes]) -> None:
        header = json.loads(lines[0])
        header["header"]["filter"]["tenant"] = None
        lines[0] = json.dumps(header).encode() + b"\n"

    err = _case(exported, "acme", edit)
    assert (err.kind, err.index) == ("removed", 0)


def test_csv_modified_cell(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = next(i for i, line in enumerate(lines) if line.startswith(b"event,12,"))
        lines[i] = lines[i].replace(b",user-5,", b",user-6,")

    err = _case(exported, "csv", edit)
    assert (err.kind, err.index) == ("modified", 12)


def test_csv_removed_row(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        lines.pop(next(i for i, line in enumerate(lines) if line.startswith(b"event,12,")))

    err = _case(exported, "csv", edit)
    assert (err.kind, err.index) == ("removed", 12)


def test_ocsf_mapped_field_changed(exported: dict[str, bytes | KeySigner]) -> None:
    def edit(lines: list[bytes]) -> None:
        i = next(i for i, line in enumerate(lines) if b'"sequence":44,' in line)
        ev = json.loads(lines[i])
        ev["actor"]["user"]["name"] = "somebody-else"
        lines[i] = json.dumps(ev).encode() + b"\n"

    err = _case(exported, "ocsf", edit)
    assert (err.kind, err.index) == ("modified", 44)


def test_wrong_public_key(exported: dict[str, bytes | KeySigner]) -> None:
    err = _verify(exported["jsonl"], KeySigner())  # type: ignore[arg-type]
    assert err.kind == "checkpoint"


def test_not_an_export() -> None:
    err = _verify(b'{"hello":1}\n', KeySigner())
    assert err.kind == "malformed"
    err = _verify(b"", KeySigner())
    assert err.kind == "header"


def test_fast_path_accepts_only_an_intact_unfiltered_jsonl_export(exported: dict[str, bytes | KeySigner]) -> None:
    signer = exported["signer"]
    assert isinstance(signer, KeySigner)
    full = exported["jsonl"]
    assert isinstance(full, bytes)
    report = _fast_jsonl(io.BytesIO(full), signer.public_key())
    assert report is not None and report.events == N
    assert _fast_jsonl(io.BytesIO(full.replace(b'"id":"obj-37"', b'"id":"obj-38"')), signer.public_key()) is None
    assert _fast_jsonl(io.BytesIO(full[:-10]), signer.public_key()) is None
    assert _fast_jsonl(io.BytesIO(exported["acme"]), signer.public_key()) is None  # type: ignore[arg-type]
    lines = _lines(full)
    lines[3], lines[4] = lines[4], lines[3]
    assert _fast_jsonl(io.BytesIO(b"".join(lines)), signer.public_key()) is None


def test_fast_path_reads_in_blocks_of_any_size(exported: dict[str, bytes | KeySigner], tmp_path: Path) -> None:
    """Blocks that cut lines anywhere, and lines longer than the block (the buffer grows), give one result."""
    signer = exported["signer"]
    assert isinstance(signer, KeySigner)
    full = exported["jsonl"]
    assert isinstance(full, bytes)
    path = tmp_path / "export.jsonl"
    path.write_bytes(full)
    reports = []
    for chunk in (1 << 20, 4096, 1000, 64):
        with open(path, "rb") as fh:
            reports.append(_fast_jsonl(fh, signer.public_key(), chunk=chunk))
        reports.append(_fast_jsonl(io.BytesIO(full), signer.public_key(), chunk=chunk))
    assert reports[0] is not None and reports[0].events == N and all(r == reports[0] for r in reports)
    lines = _lines(full)
    i = _event_line(lines, 41)
    for bad in (
        full.replace(b'"id":"obj-77"', b'"id":"obj-78"'),  # event bytes
        full[:-5],  # cut mid-line
        full + lines[-1],  # one event too many
        full.replace(lines[i], lines[i].replace(b',"leaf_hash":"', b',"leaf_hash" :"')),  # wrapper
        full.replace(lines[i], lines[i].replace(b'{"event":', b'{"event" :')),
        full.replace(lines[i], lines[i][:-4] + lines[i][-3:]),  # stated hash one digit short
        full.replace(lines[i], lines[i] + b"\n"),  # an empty line
        b"".join(lines[:i] + lines[i + 1 :]),  # well-formed lines, one missing
        b"".join(lines[: i + 1] + lines[i:]),  # one twice
        b"".join([*lines[:i], lines[i + 1], lines[i], *lines[i + 2 :]]),  # two swapped
    ):
        path.write_bytes(bad)
        for chunk in (1 << 20, 1000, 64):
            with open(path, "rb") as fh:
                assert _fast_jsonl(fh, signer.public_key(), chunk=chunk) is None


def test_fast_path_in_several_processes_matches_one_process(
    exported: dict[str, bytes | KeySigner], tmp_path: Path
) -> None:
    """Parts hashed in forked processes join to the same result; a part that starts elsewhere than its
    first line's seq says, or a tampered part, fails the whole pass."""
    signer = exported["signer"]
    assert isinstance(signer, KeySigner)
    full = exported["jsonl"]
    assert isinstance(full, bytes)
    path = tmp_path / "export.jsonl"
    path.write_bytes(full)
    with open(path, "rb") as fh:
        one = _fast_jsonl(fh, signer.public_key(), processes=1)
    assert one is not None and one.events == N
    for processes in (2, 3, 7):
        with open(path, "rb") as fh:
            assert _fast_jsonl(fh, signer.public_key(), processes=processes, chunk=1000) == one
        assert _fast_jsonl(io.BytesIO(full), signer.public_key(), processes=processes) == one
    with pytest.MonkeyPatch.context() as mp:  # no fork to be had: every part is hashed here
        mp.setattr("os.fork", lambda: (_ for _ in ()).throw(OSError("no more processes")))
        with open(path, "rb") as fh:
            assert _fast_jsonl(fh, signer.public_key(), processes=3) == one
    lines = _lines(full)
    i = _event_line(lines, 10)
    swapped = [*lines]
    j = _event_line(lines, 49)
    swapped[j], swapped[j + 1] = swapped[j + 1], swapped[j]
    for bad in (
        full.replace(b'"id":"obj-77"', b'"id":"obj-78"'),
        full[:-5],
        b"".join(lines[:i] + lines[i + 1 :]),  # well-formed lines, one missing: the later parts start early
        b"".join(lines[: i + 1] + lines[i:]),  # one twice
        b"".join(swapped),  # two swapped around the middle
    ):
        path.write_bytes(bad)
        for processes in (2, 3):
            with open(path, "rb") as fh:
                assert _fast_jsonl(fh, signer.public_key(), processes=processes) is None


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_any_byte_changed_after_the_header_is_detected(
    exported: dict[str, bytes | KeySigner], data: st.DataObject
) -> None:
    """Every byte of an event or gap record is covered: the fast and the detailed pass both reject."""
    signer = exported["signer"]
    assert isinstance(signer, KeySigner)
    name = data.draw(st.sampled_from(["jsonl", "acme", "csv", "ocsf", "window"]))
    raw = exported[name]
    assert isinstance(raw, bytes)
    body = raw.index(b"\n", 0 if name != "csv" else raw.index(b"\n") + 1) + 1
    at = data.draw(st.integers(body, len(raw) - 2))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]))
    tampered = raw[:at] + bytes([new]) + raw[at + 1 :]
    with pytest.raises(VerificationError):
        verify_export(io.BytesIO(tampered), signer.public_key())
    with pytest.raises(VerificationError):
        verify_export(io.BytesIO(tampered), signer.public_key(), fast=False)


# --- issue 13 item 10: the verifier's memory does not follow the longest line --------------------------


class _EndlessLine(io.RawIOBase):
    """A header line, then one line of `size` bytes made up as it is read (never held in memory)."""

    def __init__(self, head: bytes, size: int, fill: bytes = b"a") -> None:
        self._head, self._left, self._fill = head, size, fill

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        n = min(len(buffer), self._left)
        buffer[:n] = self._fill * n
        self._left -= n
        return n


@pytest.mark.parametrize("name", ["jsonl", "csv"])
def test_a_huge_line_gets_a_verdict_naming_it_in_bounded_memory(
    exported: dict[str, bytes | KeySigner], name: str
) -> None:
    """A 1 GiB line (made up while read) is refused at line 2 (3 for CSV) with a few MB of memory; the old
    verifier read it whole (5.3 GB, MemoryError, no verdict)."""
    import tracemalloc

    signer = exported["signer"]
    raw = exported[name]
    assert isinstance(signer, KeySigner) and isinstance(raw, bytes)
    head = b"".join(raw.splitlines(keepends=True)[: 2 if name == "csv" else 1])
    tracemalloc.start()
    try:
        with pytest.raises(Oversized) as info:
            verify_export(io.BufferedReader(_EndlessLine(head, 1 << 30)), signer.public_key())
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.kind == "oversized" and info.value.line == head.count(b"\n") + 1
    assert f"line {info.value.line} is longer than" in str(info.value)
    assert peak < 16 << 20, peak


def test_a_long_line_in_a_file_fails_both_passes_at_its_line(
    exported: dict[str, bytes | KeySigner], tmp_path: Path
) -> None:
    signer = exported["signer"]
    raw = exported["jsonl"]
    assert isinstance(signer, KeySigner) and isinstance(raw, bytes)
    lines = _lines(raw)
    lines[5] = lines[5][:-1] + b" " * (5 << 20) + b"\n"  # 5 MiB: longer than the fast pass's block too
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"".join(lines))
    for fast in (True, False):
        with pytest.raises(Oversized) as info:
            verify_export(path, signer.public_key(), fast=fast)
        assert info.value.line == 6


def test_every_event_record_can_write_fits_the_readers_bound(sqlite_db: Database) -> None:
    """The bound is not arbitrary: the largest event record() accepts, in every format, stays below it."""
    from audit import Actor, record
    from audit.export.records import MAX_LINE_BYTES
    from audit.service import MAX_EVENT_BYTES

    worst = {"k": "\u0001" * 2700}  # control characters: 6 bytes each when escaped (16 kB, the limit)
    with sqlite_db.session() as s:
        ev = record(
            s,
            actor=Actor("\u0002" * 512, "admin"),
            action="a" * 30 + ".b",
            object_type="\u0003" * 64,
            object_id="\u0004" * 512,
            summary=worst,
            reason="\u0005" * 2000,
            request_id="\u0006" * 128,
        )
    assert len(ev.data.encode()) <= MAX_EVENT_BYTES
    signer = KeySigner()
    for fmt in ("jsonl", "csv", "ocsf"):
        buf = io.BytesIO()
        export_events(sqlite_db, signer, buf, fmt=fmt)
        assert max(len(line) for line in buf.getvalue().splitlines()) < MAX_LINE_BYTES
        verify_export(io.BytesIO(buf.getvalue()), signer.public_key())


# --- issue 13 item 11: spreadsheet-saved exports -------------------------------------------------------


def test_a_csv_saved_with_a_byte_order_mark_verifies(exported: dict[str, bytes | KeySigner]) -> None:
    signer = exported["signer"]
    raw = exported["csv"]
    assert isinstance(signer, KeySigner) and isinstance(raw, bytes)
    for saved in (b"\xef\xbb\xbf" + raw, b"\xef\xbb\xbf" + raw.replace(b"\n", b"\r\n")):
        assert verify_export(io.BytesIO(saved), signer.public_key()).events == N
    err = _verify(b"\xef\xbb\xbf" + raw.replace(b",user-5,", b",user-6,", 1), signer)
    assert err.kind == "modified"  # read as CSV, not reported as a malformed JSONL file


@pytest.mark.parametrize("name", ["jsonl", "csv"])
def test_a_second_header_is_named_at_its_line(exported: dict[str, bytes | KeySigner], name: str) -> None:
    raw = exported[name]
    assert isinstance(raw, bytes)
    lines = _lines(raw)
    header = 1 if name == "csv" else 0
    lines.insert(10, lines[header])  # becomes line 11
    err = _verify(b"".join(lines), exported["signer"])  # type: ignore[arg-type]
    assert err.kind == "malformed" and err.line == 11 and str(err).startswith("line 11:"), err
