"""Sampled per-decision records: input, result, reasons and the policy version hash; queryable, and
exported (streamed, constant memory) beside the audit exports.

Export layout (JSONL; the CSV form carries the same three kinds of record in a `record` column):

1. `{"header": {...}}`: format, version, the filter (since, until, tenant), the record `count`, when;
2. one `{"decision": {...}}` line per record, oldest first (id, ts, kind, tenant, allowed, outcome,
   input, result, reasons, policy_hash);
3. `{"trailer": {"count": n, "sha256": hex}}`: SHA-256 over the exact bytes of every decision line
   (newline included), in order. A file cut short lacks the trailer or does not match it.

The trailer detects truncation and accidental damage; it is not a signature (anyone rewriting the file
can recompute it). Count and records come from one snapshot, so the header count is exact.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from sqlalchemy import func
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from core.clock import Clock, as_utc, require_aware, system_clock
from core.errors import InvalidInput, NotFound
from core.slugs import is_slug
from policy.decide import AuthzDecision, FlowDecision, GrantDecision
from policy.models import DecisionRecord
from store.db import Database, DriverInsert

log = logging.getLogger(__name__)
_TABLE: Any = DecisionRecord.__table__  # type: ignore[attr-defined]

Decision = FlowDecision | GrantDecision | AuthzDecision
KINDS = ("flow", "grant", "authz")


def _outcome(decision: Decision) -> tuple[bool, str]:
    if isinstance(decision, GrantDecision):
        return decision.outcome != "deny", decision.outcome
    return decision.allow, "allow" if decision.allow else "deny"


# A decision record not yet written: its columns' values by name (the database numbers it). A plain dict, not the
# DecisionRecord model: building that cost ~20 us a grant request, as much as writing the row, and nothing reads it
# back through the ORM.
DecisionRow = dict[str, Any]


class DecisionLog:
    """Writes a sample of decisions (every deny by default, allows at `sample_rate`) in their own transaction."""

    def __init__(
        self,
        db: Database,
        *,
        sample_rate: float = 1.0,
        always_log_denies: bool = True,
        rng: random.Random | None = None,
        clock: Clock = system_clock,
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise InvalidInput("sample_rate must be between 0 and 1")
        self.db = db
        self.sample_rate = sample_rate
        self.always_log_denies = always_log_denies
        # sampling, not security; seeded only when it decides anything (0 < rate < 1): the API builds a log per
        # decision at the default rate 1.0, and seeding a generator from os.urandom was a tenth of the record
        self._rng = rng
        self.clock = clock

    def sampled(self, allowed: bool) -> bool:
        if not allowed and self.always_log_denies:
            return True
        if self.sample_rate >= 1.0:
            return True  # random() < 1.0 always
        if self.sample_rate <= 0.0:
            return False
        if self._rng is None:
            self._rng = random.Random()
        return self._rng.random() < self.sample_rate

    def record(
        self, kind: str, input: Mapping[str, Any], decision: Decision, policy_hash: str | None, *, owner: str | None
    ) -> bool:
        """True when the decision was written; a logging failure is logged, never raised."""
        row = self.row(kind, input, decision, policy_hash, owner=owner)
        if row is None:
            return False
        try:
            # one INSERT on a plain connection, no ORM session: explain writes a record per call, and the
            # session's unit of work cost more than the decision (issue 13, item 6)
            with self.db.engine.begin() as conn:
                conn.execute(_INSERT, [row])
        except Exception:
            log.exception("could not write the decision log record")
            return False
        return True

    def row(
        self, kind: str, input: Mapping[str, Any], decision: Decision, policy_hash: str | None, *, owner: str | None
    ) -> DecisionRow | None:
        """The record to write when this decision is sampled (None otherwise), for a caller that adds it
        to its own transaction (the decision commits with what it decided).

        `owner` is whose log the record lands in: the tenant of the principal that asked, or None (the
        operator's log) for a platform principal. Never taken from the input: explaining `B -> A` as
        tenant A is A's question, and B must not read it (issue 13, item 9)."""
        if owner is not None and not is_slug(owner):
            raise InvalidInput(f"decision record owner {owner!r} is not a tenant slug")
        if kind not in KINDS:
            raise InvalidInput(f"decision kind {kind!r} is not one of {', '.join(KINDS)}")
        allowed, outcome = _outcome(decision)
        if not self.sampled(allowed):
            return None
        return {"ts": self.clock(), "kind": kind, "tenant": owner, "allowed": allowed, "outcome": outcome,
                "input": dict(input), "result": decision.to_dict(), "reasons": list(decision.reasons),
                "policy_hash": policy_hash}


_INSERT = _TABLE.insert()
# the INSERT as a data-modifying CTE that another INSERT carries (PostgreSQL, psycopg's SQL on the driver's cursor):
# one round trip writes both rows (policy/grants.py).
PG_INSERT = DriverInsert(_TABLE, prefix="decision_", skip=("id",))
INSERT_CTE_SQL = f"WITH decision AS ({PG_INSERT.sql}) "


def add(session: Session, record: DecisionRow) -> None:
    """Write `record` in the session's transaction as one Core INSERT (no unit-of-work flush: on the grant
    write path it cost as much as the rest of the write; nobody reads the record back from the session)."""
    session.connection().execute(_INSERT, record)


def query_decisions(
    session: Session,
    *,
    kind: str | None = None,
    tenant: str | None = None,
    allowed: bool | None = None,
    policy_hash: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> list[DecisionRecord]:
    """Newest first; every filter optional."""
    if not 1 <= limit <= 10_000:
        raise InvalidInput("limit must be between 1 and 10000")
    stmt = select(DecisionRecord)
    if kind is not None:
        stmt = stmt.where(col(DecisionRecord.kind) == kind)
    if tenant is not None:
        stmt = stmt.where(col(DecisionRecord.tenant) == tenant)
    if allowed is not None:
        stmt = stmt.where(col(DecisionRecord.allowed).is_(allowed))
    if policy_hash is not None:
        stmt = stmt.where(col(DecisionRecord.policy_hash) == policy_hash)
    # SQLite keeps times as UTC text without an offset: compare in UTC whatever zone the caller used.
    if since is not None:
        stmt = stmt.where(col(DecisionRecord.ts) >= require_aware(since, "since"))
    if until is not None:
        stmt = stmt.where(col(DecisionRecord.ts) < require_aware(until, "until"))
    stmt = stmt.order_by(col(DecisionRecord.id).desc()).limit(limit)
    return list(session.exec(stmt).all())


def get_decision(session: Session, record_id: int) -> DecisionRecord:
    """One sampled decision record, or NotFound."""
    row = session.get(DecisionRecord, record_id)
    if row is None:
        raise NotFound(f"decision record {record_id} not found")
    return row


# --- export -------------------------------------------------------------------------------------------

EXPORT_FORMAT = "trustfabric-decision-export"
EXPORT_VERSION = 1
EXPORT_FORMATS: tuple[str, ...] = ("jsonl", "csv")
CSV_COLUMNS = (
    "record", "id", "ts", "kind", "tenant", "allowed", "outcome", "input", "result", "reasons", "policy_hash", "data",
)
HASHING = "SHA-256 over the bytes of every decision line (newline included), in file order"

_decisions = DecisionRecord.__table__  # type: ignore[attr-defined]
_COLUMNS = (
    _decisions.c.id, _decisions.c.ts, _decisions.c.kind, _decisions.c.tenant, _decisions.c.allowed,
    _decisions.c.outcome, _decisions.c.input, _decisions.c.result, _decisions.c.reasons, _decisions.c.policy_hash,
)


class DecisionExportError(InvalidInput):
    """A decision export that is cut short, damaged or not a decision export at all."""


@dataclass(frozen=True)
class DecisionExportResult:
    count: int
    sha256: str
    filter: dict[str, Any]


def format_ts(ts: datetime) -> str:
    """UTC, microseconds, 'Z' (the audit export's form)."""
    return as_utc(ts).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"  # years < 1000 padded


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def export_filter(since: datetime | None, until: datetime | None, tenant: str | None) -> dict[str, Any]:
    """The filter as the header names it; InvalidInput for a bad one (nothing is written then)."""
    s = require_aware(since, "since") if since is not None else None
    u = require_aware(until, "until") if until is not None else None
    if s is not None and u is not None and s >= u:
        raise InvalidInput("since must be before until")
    if tenant is not None and not is_slug(tenant):
        raise InvalidInput(f"tenant {tenant!r} is not a DNS-label slug")
    return {"since": format_ts(s) if s else None, "until": format_ts(u) if u else None, "tenant": tenant}


def decision_document(row: Any) -> dict[str, Any]:
    """One record as exported: every field, the time as UTC ISO 8601 with 'Z'."""
    return {
        "id": int(row.id),
        "ts": format_ts(row.ts),
        "kind": row.kind,
        "tenant": row.tenant,
        "allowed": bool(row.allowed),
        "outcome": row.outcome,
        "input": row.input,
        "result": row.result,
        "reasons": list(row.reasons),
        "policy_hash": row.policy_hash,
    }


class _JsonlWriter:
    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def header(self, header: dict[str, Any]) -> None:
        self.out.write(('{"header":' + _compact(header) + "}\n").encode())

    def record(self, doc: dict[str, Any]) -> bytes:
        line = ('{"decision":' + _compact(doc) + "}\n").encode()
        self.out.write(line)
        return line

    def trailer(self, trailer: dict[str, Any]) -> None:
        self.out.write(('{"trailer":' + _compact(trailer) + "}\n").encode())


class _CsvWriter(_JsonlWriter):
    """Every row is one physical line: the JSON cells are compact and escape their newlines."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__(out)
        self._buf = io.StringIO()
        self._csv = csv.writer(self._buf, lineterminator="\n")
        self._emit(list(CSV_COLUMNS))

    def _emit(self, cells: list[Any]) -> bytes:
        self._buf.seek(0)
        self._buf.truncate()
        self._csv.writerow(cells)
        line = self._buf.getvalue().encode()
        self.out.write(line)
        return line

    def _row(self, **cells: Any) -> bytes:
        return self._emit(["" if cells.get(c) is None else cells[c] for c in CSV_COLUMNS])

    def header(self, header: dict[str, Any]) -> None:
        self._row(record="header", data=_compact(header))

    def record(self, doc: dict[str, Any]) -> bytes:
        return self._row(
            record="decision",
            **{k: doc[k] for k in ("id", "ts", "kind", "tenant", "outcome", "policy_hash")},
            allowed="true" if doc["allowed"] else "false",
            input=_compact(doc["input"]),
            result=_compact(doc["result"]),
            reasons=_compact(doc["reasons"]),
        )

    def trailer(self, trailer: dict[str, Any]) -> None:
        self._row(record="trailer", data=_compact(trailer))


def _where(stmt: Any, flt: dict[str, Any]) -> Any:
    if flt["since"] is not None:
        stmt = stmt.where(_decisions.c.ts >= _parse_ts(flt["since"]))
    if flt["until"] is not None:
        stmt = stmt.where(_decisions.c.ts < _parse_ts(flt["until"]))
    if flt["tenant"] is not None:
        stmt = stmt.where(_decisions.c.tenant == flt["tenant"])
    return stmt


def _parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def export_decisions(
    db: Database,
    out: IO[bytes],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
    fmt: str = "jsonl",
    clock: Clock = system_clock,
    batch: int = 1000,
) -> DecisionExportResult:
    """Stream the decision records matching the filters (since inclusive, until exclusive, tenant exact)
    to `out`, oldest first, between a header (filter, count) and a trailer (count, SHA-256 of the record
    lines). Rows come through a server-side cursor on PostgreSQL (`yield_per`): memory stays flat."""
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"decision export format {fmt!r} is not one of {', '.join(EXPORT_FORMATS)}")
    flt = export_filter(since, until, tenant)
    writer = _CsvWriter(out) if fmt == "csv" else _JsonlWriter(out)
    digest = hashlib.sha256()
    written = 0
    with db.read_session(snapshot=True) as session:  # one snapshot for the count and the rows
        conn = session.connection()
        count = int(conn.execute(_where(sa_select(func.count()).select_from(_decisions), flt)).scalar() or 0)
        writer.header(
            {
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "filter": flt,
                "count": count,
                "exported_at": format_ts(clock()),
                "output": fmt,
                "hashing": HASHING,
            }
        )
        for row in _stream(conn, flt, batch):
            digest.update(writer.record(decision_document(row)))
            written += 1
    if written != count:  # cannot happen inside one snapshot; never write a trailer that lies
        raise DecisionExportError(f"decision log changed during the export ({written} rows, {count} counted)")
    writer.trailer({"count": written, "sha256": digest.hexdigest()})
    out.flush()
    return DecisionExportResult(count=written, sha256=digest.hexdigest(), filter=flt)


def _stream(conn: Any, flt: dict[str, Any], batch: int) -> Iterator[Any]:
    result = conn.execution_options(yield_per=batch).execute(
        _where(sa_select(*_COLUMNS), flt).order_by(_decisions.c.id)
    )
    try:
        for part in result.partitions():
            yield from part
    finally:
        result.close()


@dataclass(frozen=True)
class DecisionExportReport:
    header: dict[str, Any]
    count: int
    sha256: str


def _csv_doc(cells: list[str]) -> dict[str, Any]:
    row = dict(zip(CSV_COLUMNS, cells, strict=True))
    return {
        "id": int(row["id"]),
        "ts": row["ts"],
        "kind": row["kind"],
        "tenant": row["tenant"] or None,
        "allowed": row["allowed"] == "true",
        "outcome": row["outcome"],
        "input": json.loads(row["input"]),
        "result": json.loads(row["result"]),
        "reasons": json.loads(row["reasons"]),
        "policy_hash": row["policy_hash"] or None,
    }


def verify_decision_export(
    source: IO[bytes], on_record: Callable[[dict[str, Any]], None] | None = None
) -> DecisionExportReport:
    """Check a decision export (JSONL or CSV) end to end in constant memory: a header first, a trailer
    last, the record count and the SHA-256 of the record lines as both claim. DecisionExportError
    naming the line otherwise (a truncated file lacks its trailer or does not match it).
    `on_record` receives every record as exported (CSV cells decoded back)."""
    digest = hashlib.sha256()
    header: dict[str, Any] | None = None
    trailer: dict[str, Any] | None = None
    count = 0
    fmt: str | None = None
    for number, line in enumerate(source, start=1):
        if trailer is not None:
            raise DecisionExportError(f"line {number}: data after the trailer")
        if not line.endswith(b"\n"):
            raise DecisionExportError(f"line {number}: incomplete line (the file is cut short)")
        if fmt is None:
            fmt = "csv" if line.startswith(b"record,") else "jsonl"
            if fmt == "csv":
                if next(csv.reader([line.decode()])) != list(CSV_COLUMNS):
                    raise DecisionExportError("line 1: not the decision export's CSV columns")
                continue
        kind: str
        value: Any
        try:
            if fmt == "csv":
                cells = next(csv.reader([line.decode()]))
                kind, value = cells[0], (cells if cells[0] == "decision" else json.loads(cells[-1]))
            else:
                doc = json.loads(line)
                if not isinstance(doc, dict) or len(doc) != 1:
                    raise ValueError("not one record")
                ((kind, value),) = doc.items()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise DecisionExportError(f"line {number}: unreadable ({exc})") from None
        if header is None:
            if kind != "header" or not isinstance(value, dict) or value.get("format") != EXPORT_FORMAT:
                raise DecisionExportError(f"line {number}: not a decision export (no header)")
            header = value
        elif kind == "decision":
            digest.update(line)
            count += 1
            if on_record is not None:
                try:
                    on_record(_csv_doc(value) if fmt == "csv" else value)
                except (ValueError, TypeError, KeyError) as exc:
                    raise DecisionExportError(f"line {number}: bad record ({exc})") from None
        elif kind == "trailer" and isinstance(value, dict):
            trailer = value
        else:
            raise DecisionExportError(f"line {number}: unexpected {kind!r} record")
    if header is None:
        raise DecisionExportError("empty file: no header")
    if trailer is None:
        raise DecisionExportError(f"no trailer after {count} record(s): the file is cut short")
    if trailer.get("count") != count or header.get("count") != count:
        raise DecisionExportError(
            f"{count} record(s) in the file, the header says {header.get('count')}, the trailer {trailer.get('count')}"
        )
    if trailer.get("sha256") != digest.hexdigest():
        raise DecisionExportError("the SHA-256 of the record lines does not match the trailer")
    return DecisionExportReport(header=header, count=count, sha256=digest.hexdigest())
