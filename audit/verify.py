"""Offline verification of an export: needs only the file and the audit public key.

Checks, in order: the signed checkpoint (Ed25519 by the audit key, C2SP signed note); the header
agrees with it; then every record in order -- each event's bytes hash to its stated leaf hash, it
matches the export's filter, it sits at its own sequence position, its prev_hash is the hash of the
event before it -- and gap hashes cover exactly the positions not shown; finally the rebuilt RFC 6962
root equals the checkpoint root and the tree size is reached. The first failure raises a
VerificationError naming the event (its sequence number) and the kind of problem:

    modified, removed, reordered, inserted, truncated, chain_broken, outside_filter, malformed,
    checkpoint, header, root_mismatch
"""

from __future__ import annotations

import contextlib
import csv
import gc
import hashlib
import io
import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit import merkle
from audit.checkpoint import verify_checkpoint
from audit.errors import CheckpointError, ProofError, VerificationError
from audit.export import CSV_COLUMNS, EVENT_PREFIX, EXPORT_FORMAT, EXPORT_VERSION, LEAF_INFIX, context_positions
from audit.ocsf import to_ocsf
from audit.service import DOCUMENT_VERSION, GENESIS_HASH

_SUFFIX_LEN = len(LEAF_INFIX) + 64 + 2  # ,"leaf_hash":"<64 hex>"}


@dataclass
class _Event:
    line: int
    data: bytes  # the exact leaf input
    stated_leaf: str
    doc: dict[str, Any] | None  # parsed lazily for JSONL
    ocsf: dict[str, Any] | None = None


@dataclass
class _Gap:
    line: int
    level: int
    start: int
    hash: bytes


@dataclass(frozen=True)
class VerifyReport:
    origin: str
    tree_size: int
    root: bytes
    events: int
    gaps: int
    range: tuple[int, int]
    filter: dict[str, Any]


def _malformed(line: int, message: str, index: int | None = None) -> VerificationError:
    return VerificationError("malformed", f"line {line}: {message}", index=index, line=line)


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _gap_from(obj: Any, line: int) -> _Gap:
    if not isinstance(obj, dict) or set(obj) != {"hash", "level", "start"}:
        raise _malformed(line, "gap record needs exactly hash, level and start")
    level, start, h = obj["level"], obj["start"], obj["hash"]
    if type(level) is not int or type(start) is not int or not 0 <= level < 63 or start < 0 or not _is_hex64(h):
        raise _malformed(line, "gap record has a bad level, start or hash")
    return _Gap(line, level, start, bytes.fromhex(h))


# --- readers: each yields the header dict first, then _Event / _Gap records ---------------------------


def _read_jsonl(stream: IO[bytes]) -> Iterator[Any]:
    origin = ""
    for lineno, raw in enumerate(stream, start=1):
        if not raw.endswith(b"\n"):
            raise VerificationError("truncated", f"line {lineno} is cut off: the file ends mid-record", line=lineno)
        line = raw[:-1]
        if line.startswith(EVENT_PREFIX):
            if (
                len(line) < len(EVENT_PREFIX) + _SUFFIX_LEN
                or line[-_SUFFIX_LEN:-66] != LEAF_INFIX
                or not line.endswith(b'"}')
            ):
                raise _malformed(lineno, "event record is not in the export's exact form")
            leaf = line[-66:-2].decode("ascii", errors="replace")
            if not _is_hex64(leaf):
                raise _malformed(lineno, "event leaf_hash is not 64 lowercase hex digits")
            yield _Event(lineno, line[len(EVENT_PREFIX) : -_SUFFIX_LEN], leaf, None)
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise _malformed(lineno, f"not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise _malformed(lineno, "record is not a JSON object")
        if "class_uid" in obj:  # an OCSF event
            tf = (obj.get("unmapped") or {}).get("trustfabric") if isinstance(obj.get("unmapped"), dict) else None
            if not isinstance(tf, dict) or not isinstance(tf.get("event"), dict) or not _is_hex64(tf.get("leaf_hash")):
                raise _malformed(lineno, "OCSF event lacks unmapped.trustfabric.event / leaf_hash")
            doc = tf["event"]
            try:
                data = bytes(rfc8785.dumps(doc))
            except Exception as exc:
                raise _malformed(lineno, f"OCSF event document is not canonicalizable: {exc}") from exc
            try:
                expected = to_ocsf(doc, tf["leaf_hash"], origin=origin)
            except (KeyError, TypeError, ValueError, AttributeError):
                expected = None
            yield _Event(lineno, data, tf["leaf_hash"], doc, ocsf=obj if expected != obj else None)
        elif set(obj) == {"gap"}:
            yield _gap_from(obj["gap"], lineno)
        elif set(obj) == {"header"} and isinstance(obj["header"], dict):
            origin = str(obj["header"].get("origin", ""))
            yield obj["header"]
        else:
            raise _malformed(lineno, "unknown record")


def _read_csv(stream: IO[bytes]) -> Iterator[Any]:
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
    reader = csv.reader(text)
    first = next(reader, None)
    if first is None or tuple(first) != CSV_COLUMNS:
        raise _malformed(1, "CSV header row does not name the export's columns")
    for row in reader:
        lineno = reader.line_num
        if len(row) != len(CSV_COLUMNS):
            raise VerificationError(
                "truncated" if len(row) < len(CSV_COLUMNS) else "malformed",
                f"line {lineno}: CSV row has {len(row)} cells, want {len(CSV_COLUMNS)}",
                line=lineno,
            )
        cell = dict(zip(CSV_COLUMNS, row, strict=True))
        kind = cell["record"]
        if kind == "header":
            try:
                yield json.loads(cell["data"])
            except ValueError as exc:
                raise _malformed(lineno, "header data is not JSON") from exc
        elif kind == "gap":
            try:
                yield _gap_from({"hash": cell["hash"], "level": int(cell["level"]), "start": int(cell["seq"])}, lineno)
            except ValueError as exc:
                raise _malformed(lineno, "gap level/start is not a number") from exc
        elif kind == "event":
            try:
                doc = {
                    "v": DOCUMENT_VERSION,
                    "seq": int(cell["seq"]),
                    "ts": cell["ts"],
                    "actor": {"id": cell["actor_id"], "kind": cell["actor_kind"]},
                    "tenant": cell["tenant"] or None,
                    "action": cell["action"],
                    "object": {"type": cell["object_type"], "id": cell["object_id"]},
                    "summary": json.loads(cell["summary"]),
                    "reason": cell["reason"] or None,
                    "request_id": cell["request_id"] or None,
                    "prev_hash": cell["prev_hash"],
                }
                data = bytes(rfc8785.dumps(doc))
            except Exception as exc:
                raise _malformed(lineno, f"event row cannot be rebuilt: {exc}") from exc
            yield _Event(lineno, data, cell["leaf_hash"], doc)
        else:
            raise _malformed(lineno, f"unknown record type {kind!r}")


class _Prefixed(io.RawIOBase):
    """A stream with some already-read bytes put back in front (format sniffing without seek)."""

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
    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it
        self._buf: list[Any] = []

    def __iter__(self) -> _Peekable:
        return self

    def __next__(self) -> Any:
        if self._buf:
            return self._buf.pop()
        return next(self._it)

    def peek(self) -> Any:
        if not self._buf:
            try:
                self._buf.append(next(self._it))
            except (StopIteration, VerificationError):
                return None
        return self._buf[-1]


def _parse_doc(ev: _Event, pos: int) -> dict[str, Any]:
    if ev.doc is None:
        try:
            ev.doc = json.loads(ev.data)
        except ValueError as exc:
            raise _malformed(ev.line, f"event is not JSON ({exc})", index=pos) from exc
    doc = ev.doc
    if (
        not isinstance(doc, dict)
        or type(doc.get("seq")) is not int
        or not isinstance(doc.get("prev_hash"), str)
        or not isinstance(doc.get("action"), str)
        or not (doc.get("tenant") is None or isinstance(doc.get("tenant"), str))
    ):
        raise _malformed(ev.line, "event lacks seq, prev_hash, action or tenant", index=pos)
    return doc


def verify_export(source: str | Path | IO[bytes], public_key: Ed25519PublicKey, *, fast: bool = True) -> VerifyReport:
    """Verify an export file (JSONL, CSV or OCSF, detected); VerificationError at the first problem.

    An unfiltered JSONL export from a seekable source first takes the fast path: hash every event's
    bytes and rebuild the root in blocks, without parsing JSON. A root equal to the signed one proves
    every byte (and with them each event's sequence number and prev_hash, which record() wrote from
    the position) -- the detailed checks could not fail. Any difference, and every other kind of
    export, goes through the detailed record-by-record pass, which names the first bad event.
    """
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            return verify_export(fh, public_key, fast=fast)
    start = source.tell() if fast and source.seekable() else None
    if start is not None:
        report = _fast_jsonl(source, public_key)
        if report is not None:
            return report
        source.seek(start)
    head = source.read(7)
    is_csv = head == b"record,"
    stream = _Prefixed(head, source)
    buffered = io.BufferedReader(stream, buffer_size=1 << 20)
    records = _Peekable(_read_csv(buffered) if is_csv else _read_jsonl(buffered))
    try:
        return _verify_records(records, public_key)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise VerificationError("malformed", f"the file is not a well-formed export: {exc}") from exc


# A fast-path event line: EVENT_PREFIX, the event's bytes, LEAF_INFIX, 64 hex digits, '"}', newline.
# The span from one event's LEAF_INFIX to the next event's bytes is fixed but for the hex digits.
_TAIL = len(LEAF_INFIX) + 64 + 2  # ,"leaf_hash":"<64 hex>"}
_BETWEEN = b'"}\n' + EVENT_PREFIX + LEAF_INFIX  # what stands between two events' leaf hash hex digits


def _fast_jsonl(
    fh: IO[bytes],
    public_key: Ed25519PublicKey,
    *,
    chunk: int = 4 << 20,
    processes: int | None = None,
    parallel_min_bytes: int = 8 << 20,
) -> VerifyReport | None:
    """The whole-file check without parsing events; None when anything is off or not applicable.

    Only an export of the whole tree qualifies (no tenant/action filter, range [0, n), no context
    events), so its body must be exactly n event lines -- a gap record sends it to the detailed pass.
    The body is read in `chunk`-sized blocks into one reused buffer; each event's leaf hash is taken
    straight from the buffer (no per-line bytes objects) and the tree is built in aligned subtrees.

    A body of at least `parallel_min_bytes` is cut into one part per CPU (`processes` overrides), each
    hashed by a forked process into the aligned subtrees of its own range of positions; this process
    hashes the first part and joins them in file order. Where a part starts is read from the "seq" of
    its first line, but only as a guess: each part must hold exactly the events up to the next part's
    start and all of them exactly n, so positions are counted, never taken from the file."""
    first = fh.readline()
    if not first.startswith(b'{"header":') or not first.endswith(b"\n"):
        return None
    try:
        header = json.loads(first)["header"]
        cp = verify_checkpoint(header["checkpoint"], public_key)
        flt, rng = header["filter"], header["range"]
        lo, hi = int(rng["start"]), int(rng["end"])
        if (
            header.get("format") != EXPORT_FORMAT
            or header.get("version") != EXPORT_VERSION
            or header.get("tree_size") != cp.size
            or header.get("origin") != cp.origin
            or flt.get("tenant") is not None
            or flt.get("action") is not None
            or not 0 <= lo <= hi <= cp.size
            or _range_hides_events(flt, lo, hi, cp.size) is not None
            or context_positions(flt, lo, hi, cp.size) != (None, None)  # the detailed pass checks them
            or (lo, hi) != (0, cp.size)  # implied by the two lines above; stated for the reader
        ):
            return None
    except (ValueError, KeyError, TypeError, AttributeError, CheckpointError):
        return None
    n = cp.size
    body = fh.tell()
    end = fh.seek(0, io.SEEK_END)
    read_at, shareable = _reader(fh)
    if not shareable:
        processes = 1
    elif processes is None:
        processes = _cpus() if end - body >= parallel_min_bytes and _can_fork() else 1
    parts = _split(read_at, body, end, n, processes)
    cr = merkle.CompactRange()
    for (_start, _stop, at), part in zip(parts, _hash_parts(read_at, parts, n, chunk), strict=True):
        if part is None or at != cr.size:
            return None
        try:
            for level, node in part[1]:
                cr.append_node(level, node)
        except ProofError:
            return None
        if cr.size != at + part[0]:
            return None
    if cr.size != n or cr.root() != cp.root:
        return None
    return VerifyReport(cp.origin, n, cp.root, n, 0, (lo, hi), dict(flt))


_ReadAt = Callable[[memoryview, int], int]


def _reader(fh: IO[bytes]) -> tuple[_ReadAt, bool]:
    """read_at(view, offset) -> bytes read into view, and whether forked processes may use it at once:
    pread on a real file (no shared file position), seek + read on an in-memory stream (each process
    has its own copy), seek + read on a file without pread (not shareable: one file position)."""
    try:
        fd = fh.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd >= 0 and hasattr(os, "preadv"):
        return (lambda view, offset: os.preadv(fd, [view], offset)), True

    def read_at(view: memoryview, offset: int) -> int:
        fh.seek(offset)
        data = fh.read(len(view))
        view[: len(data)] = data
        return len(data)

    return read_at, fd < 0


def _cpus() -> int:
    try:
        return min(len(os.sched_getaffinity(0)), 8)
    except AttributeError:
        return min(os.cpu_count() or 1, 8)


def _can_fork() -> bool:
    """fork is only safe while no other thread may hold a lock the child needs (OpenSSL, logging)."""
    return hasattr(os, "fork") and threading.active_count() == 1


_SEQ = re.compile(rb',"seq":(0|[1-9][0-9]{0,17})[,}]')


def _split(read_at: _ReadAt, body: int, end: int, n: int, processes: int) -> list[tuple[int, int, int]]:
    """Cut file bytes [body, end) at line starts into up to `processes` parts (start, stop, first event)
    of about equal size; `first` is the seq its first line states (a guess, checked by the caller).
    Fewer parts where a cut finds no such line."""
    cuts = [(body, 0)]
    window = bytearray(1 << 16)
    for j in range(1, processes):
        at = body + (end - body) * j // processes
        got = read_at(memoryview(window), at - 1)
        nl = window.find(b"\n", 0, got)
        line_end = window.find(b"\n", nl + 1, got)
        if nl < 0 or line_end < 0 or not window.startswith(EVENT_PREFIX, nl + 1):
            continue
        seq = _SEQ.search(window, nl + 1, line_end)
        if seq is None:
            continue
        start, first = at + nl, int(seq.group(1))
        if start > cuts[-1][0] and cuts[-1][1] < first <= n:
            cuts.append((start, first))
    return [(a, b, first) for (a, first), (b, _) in zip(cuts, [*cuts[1:], (end, n)], strict=True)]


def _hash_parts(read_at: _ReadAt, parts: list[tuple[int, int, int]], n: int, chunk: int) -> list[_Part]:
    """_hash_part of every part, the first here and each other in a forked process (here as well where
    fork fails)."""
    children: list[tuple[int, int] | None] = []  # (pid, read end of its pipe), None: hash it here
    try:
        for start, stop, first in parts[1:]:
            try:
                r, w = os.pipe()
            except OSError:
                children.append(None)
                continue
            try:
                pid = os.fork()
            except OSError:
                os.close(r)
                os.close(w)
                children.append(None)
                continue
            if pid == 0:  # the child: hash, send the result, exit without running any cleanup
                try:
                    os.close(r)
                    gc.disable()
                    data = memoryview(_encode_part(_hash_part(read_at, start, stop, first, n, chunk)))
                    while data:
                        data = data[os.write(w, data) :]
                finally:
                    os._exit(0)
            os.close(w)
            children.append((pid, r))
        results: list[_Part] = []
        for part, child in zip(parts, [None, *children], strict=True):
            if child is None:
                results.append(_hash_part(read_at, *part, n, chunk))
            else:
                with os.fdopen(child[1], "rb", closefd=False) as pipe:
                    results.append(_decode_part(pipe.read()))
            if results[-1] is None:  # no need to wait for the others
                return results + [None] * (len(parts) - len(results))
        return results
    finally:
        for child in children:
            if child is not None:
                pid, r = child
                os.close(r)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # a child still hashing when this pass has already failed
                os.waitpid(pid, 0)


_Nodes = list[tuple[int, bytes]]
_Part = tuple[int, _Nodes] | None  # (events, aligned subtrees) of a part; None if it failed


def _encode_part(part: _Part) -> bytes:
    if part is None:
        return b""
    count, nodes = part
    return count.to_bytes(8, "big") + b"".join(bytes([level]) + node for level, node in nodes)


def _decode_part(data: bytes) -> _Part:
    if len(data) < 8 or (len(data) - 8) % 33:
        return None
    nodes = [(data[k], data[k + 1 : k + 33]) for k in range(8, len(data), 33)]
    return int.from_bytes(data[:8], "big"), nodes


def _hash_part(read_at: _ReadAt, start: int, stop: int, first: int, n: int, chunk: int) -> tuple[int, _Nodes] | None:
    """Hash the event lines in file bytes [start, stop), the first being event `first`: (how many, the
    aligned subtrees (level, hash) covering [first, first + how many), left to right); None if a line
    is not an event record in the export's exact form, an event's stated leaf_hash is not the hash of
    its bytes, the file ends mid-line, or there are more events than the tree has."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    stack: _Nodes = []
    pos, offset, have = first, start, 0
    try:
        while offset < stop or have:
            if have == len(buf):  # one line longer than the buffer
                view.release()
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            got = read_at(view[have : have + min(len(buf) - have, stop - offset)], offset) if offset < stop else 0
            offset += got
            have += got
            cut = buf.rfind(b"\n", 0, have) + 1
            if not cut:
                if offset < stop and got:
                    continue
                return None  # the file ends mid-line
            leaves = _leaf_hashes(buf, view, cut)
            if leaves is None or pos + len(leaves) > n:
                return None
            _push_leaves(stack, pos, leaves)
            pos += len(leaves)
            rest = bytes(view[cut:have])
            buf[: len(rest)] = rest
            have = len(rest)
    finally:
        view.release()
    return pos - first, stack


def _leaf_hashes(buf: bytearray, view: memoryview, size: int) -> list[bytes] | None:
    """Leaf hashes of the whole event lines in buf[:size] (which ends with a newline), checked against
    the leaf_hash each line states; None if a line is not in the exact form. Each event's bytes are
    hashed in place: the ':' before them (checked) is overwritten with the 0x00 leaf prefix."""
    if not buf.startswith(EVENT_PREFIX):
        return None
    sha = hashlib.sha256
    find = buf.find
    skip = len(EVENT_PREFIX) - 1
    leaves: list[bytes] = []
    tails: list[bytearray] = []
    leaf, tail = leaves.append, tails.append
    s = 0
    try:
        while s < size:
            e = find(b"\n", s)
            buf[s + skip] = 0
            leaf(sha(view[s + skip : e - _TAIL]).digest())
            tail(buf[e - _TAIL : e + 1 + len(EVENT_PREFIX)])  # ,"leaf_hash":"<hex>"}\n{"event": (the next)
            s = e + 1
    except (IndexError, ValueError):
        return None
    # One comparison for the block: every line's leaf_hash and the fixed bytes around it, and every
    # next line's EVENT_PREFIX (the last tail may run past the block: its prefix is checked with the next).
    stated = b"".join(tails)
    expected = LEAF_INFIX + b"".join(leaves).hex(" ", 32).encode().replace(b" ", _BETWEEN) + b'"}\n'
    if not stated.startswith(expected) or len(stated) > len(expected) + len(EVENT_PREFIX):
        return None
    return leaves


def _push_leaves(stack: _Nodes, pos: int, leaves: list[bytes]) -> None:
    """Add leaves [pos, pos + len) to the compact range `stack` in aligned complete subtrees, each
    reduced a level at a time; a subtree whose left sibling is on the stack is merged with it."""
    sha = hashlib.sha256
    offset = 0
    for level, _index in merkle.range_nodes(pos, pos + len(leaves)):
        width = 1 << level
        nodes = leaves[offset : offset + width]
        while len(nodes) > 1:
            pairs = iter(nodes)
            nodes = [sha(b"\x01" + left + right).digest() for left, right in zip(pairs, pairs, strict=True)]
        node, at, lv = nodes[0], pos + offset, level
        while stack and stack[-1][0] == lv and (at >> lv) & 1:
            node = sha(b"\x01" + stack.pop()[1] + node).digest()
            at -= 1 << lv
            lv += 1
        stack.append((lv, node))
        offset += width


def _range_hides_events(flt: dict[str, Any], lo: int, hi: int, n: int) -> VerificationError | None:
    """The header's range and filter are not signed: an export without --since must start at event 0 and
    one without --until must reach the checkpoint's size, or whoever edited the header hid events behind
    gap hashes (a cut tail, a cut head) while the root still matches."""
    if flt.get("since") is None and lo != 0:
        return VerificationError(
            "removed", f"the export has no --since, yet its range starts at event {lo}: events before it are hidden",
            index=0,
        )
    if flt.get("until") is None and hi != n:
        return VerificationError(
            "truncated",
            f"the export has no --until, yet its range stops at event {hi} of the checkpoint's {n}: the tail is hidden",
            index=hi,
        )
    return None


def _window_bound(flt: dict[str, Any], name: str) -> datetime | None:
    value = flt.get(name)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise VerificationError("header", f"the header's filter {name} {str(value)[:40]!r} is not a UTC time")
    return parsed


def _check_context(
    doc: dict[str, Any], seq: int, before: int | None, since: datetime | None, until: datetime | None, line: int
) -> None:
    """A context event must lie outside the time window, or the range was cut short."""
    try:
        ts = datetime.fromisoformat(str(doc.get("ts")).replace("Z", "+00:00"))
    except ValueError:
        raise _malformed(line, "event ts is not a time", index=seq) from None
    if seq == before and since is not None and not ts < since:
        raise VerificationError(
            "removed",
            f"it stands just before the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            index=seq,
            line=line,
        )
    if seq != before and until is not None and not ts >= until:
        raise VerificationError(
            "truncated",
            f"it stands just after the range as context, yet its time {doc.get('ts')} is inside the window: "
            "the range was cut short",
            index=seq,
            line=line,
        )


def _verify_records(records: _Peekable, public_key: Ed25519PublicKey) -> VerifyReport:
    header = next(records, None)
    if not isinstance(header, dict):
        raise VerificationError("header", "the export does not start with a header record")
    if header.get("format") != EXPORT_FORMAT or header.get("version") != EXPORT_VERSION:
        raise VerificationError("header", f"not a {EXPORT_FORMAT} version {EXPORT_VERSION} file")
    note = header.get("checkpoint")
    if not isinstance(note, str):
        raise VerificationError("header", "the header carries no checkpoint")
    try:
        cp = verify_checkpoint(note, public_key)
    except CheckpointError as exc:
        raise VerificationError("checkpoint", str(exc)) from exc
    n = cp.size
    if header.get("tree_size") != n or header.get("origin") != cp.origin:
        raise VerificationError("header", "header tree size or origin differ from the signed checkpoint")
    rng, flt = header.get("range"), header.get("filter")
    if not isinstance(rng, dict) or not isinstance(flt, dict):
        raise VerificationError("header", "header lacks range or filter")
    lo, hi = rng.get("start"), rng.get("end")
    if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi <= n:
        raise VerificationError("header", f"header range {rng} is not within the tree of size {n}")
    hidden = _range_hides_events(flt, lo, hi, n)
    if hidden is not None:
        raise hidden
    tenant, action = flt.get("tenant"), flt.get("action")
    narrows = tenant is not None or action is not None
    since, until = _window_bound(flt, "since"), _window_bound(flt, "until")
    before, after = context_positions(flt, lo, hi, n)
    show_lo = lo if before is None else before  # positions [show_lo, show_hi) must be shown as events
    show_hi = hi if after is None else after + 1

    cr = merkle.CompactRange()
    pos = 0
    prev_leaf: bytes | None = None  # hash of the event at pos-1 when that record was an event
    events = gaps = 0
    for rec in records:
        if isinstance(rec, _Gap):
            if rec.start != pos:
                if rec.start > pos:
                    raise VerificationError(
                        "removed",
                        f"event {pos} is missing (the next record starts at {rec.start})",
                        index=pos,
                        line=rec.line,
                    )
                raise VerificationError(
                    "inserted",
                    f"a gap record at line {rec.line} repeats position {rec.start}",
                    index=rec.start,
                    line=rec.line,
                )
            width = 1 << rec.level
            if rec.start % width or rec.start + width > n:
                raise _malformed(rec.line, f"gap of level {rec.level} at {rec.start} is not an aligned subtree of {n}")
            if not narrows and rec.start < show_hi and rec.start + width > show_lo:
                first = max(rec.start, show_lo)
                what = "a context event of the time window" if first in (before, after) else "in the export's range"
                raise VerificationError(
                    "removed",
                    f"event {first} is {what} but hidden behind a gap hash",
                    index=first,
                    line=rec.line,
                )
            try:
                cr.append_node(rec.level, rec.hash)
            except ProofError as exc:
                raise _malformed(rec.line, str(exc)) from exc
            pos += width
            prev_leaf = None
            gaps += 1
            continue
        if not isinstance(rec, _Event):
            raise _malformed(getattr(rec, "line", 0), "a second header in the middle of the export")
        leaf = merkle.hash_leaf(rec.data)
        doc = _parse_doc(rec, pos)
        seq = doc["seq"]
        if leaf.hex() != rec.stated_leaf:
            raise VerificationError(
                "modified",
                "its content does not hash to its recorded leaf hash (a field was changed)",
                index=seq,
                line=rec.line,
            )
        if rec.ocsf is not None:
            raise VerificationError(
                "modified", "its OCSF fields differ from the signed event they carry", index=seq, line=rec.line
            )
        if tenant is not None and doc["tenant"] != tenant:
            raise VerificationError(
                "outside_filter",
                f"it belongs to tenant {doc['tenant']!r} but the export is for tenant {tenant!r}",
                index=seq,
                line=rec.line,
            )
        if action is not None and doc["action"] != action:
            raise VerificationError(
                "outside_filter",
                f"its action {doc['action']!r} is not the export's {action!r}",
                index=seq,
                line=rec.line,
            )
        if pos >= n:
            raise VerificationError(
                "inserted", f"it lies beyond the checkpoint's tree size {n}", index=seq, line=rec.line
            )
        is_context = seq in (before, after)  # (a context event out of place fails the position checks below)
        if is_context and seq == pos:
            _check_context(doc, seq, before, since, until, rec.line)
        elif not is_context and not lo <= seq < hi:
            raise VerificationError(
                "outside_filter", f"it lies outside the export's range [{lo}, {hi})", index=seq, line=rec.line
            )
        if seq != pos:
            if seq > pos:
                nxt = records.peek()
                if isinstance(nxt, _Event):
                    try:
                        nseq = _parse_doc(nxt, pos + 1)["seq"]
                    except VerificationError:
                        nseq = None
                    if nseq == pos:
                        raise VerificationError(
                            "reordered", f"events {pos} and {seq} are out of order (swapped)", index=pos, line=rec.line
                        )
                raise VerificationError(
                    "removed", f"event {pos} is missing (the next event is {seq})", index=pos, line=rec.line
                )
            raise VerificationError(
                "inserted",
                f"a second event claims sequence number {seq} (at position {pos})",
                index=seq if seq == pos - 1 else pos,
                line=rec.line,
            )
        expected_prev = GENESIS_HASH if pos == 0 else (prev_leaf.hex() if prev_leaf is not None else None)
        if expected_prev is not None and doc["prev_hash"] != expected_prev:
            if pos == 0:
                raise VerificationError(
                    "chain_broken", "the first event does not start the chain", index=0, line=rec.line
                )
            # This event is self-consistent (its bytes match its leaf hash), so the prev_hash it commits
            # to is what was recorded: the event before it is the one whose bytes changed.
            raise VerificationError(
                "modified",
                f"it no longer hashes to the prev_hash recorded by event {pos} (altered, leaf hash rewritten)",
                index=pos - 1,
                line=rec.line,
            )
        cr.append_leaf_hash(leaf)
        prev_leaf = leaf
        pos += 1
        events += 0 if is_context else 1
    if pos < n:
        raise VerificationError(
            "truncated", f"the export stops at event {pos} but the checkpoint covers {n} events", index=pos
        )
    if cr.root() != cp.root:
        raise VerificationError(
            "root_mismatch",
            "the events do not rebuild the signed checkpoint root: events were altered and their hashes recomputed",
        )
    return VerifyReport(cp.origin, n, cp.root, events, gaps, (lo, hi), dict(flt))
