"""Versioned rule sets per device, and each device's state: publish, hold back, roll back, record what the
device's agent reports. Each function takes the caller's session, an actor and the time, and records its
audit event in that session, so a change and its event commit together.

Semantics (the reconciler, enforcer/reconcile.py, and the `trustfabric enforcer` commands call these):
- a device's desired rule set is its latest published version; versions count up from 1 and never change;
- `publish` stores a new version only when the content hash differs from the desired one; its audit event
  (`enforcer.publish`) carries the version, the hash and the plan summary against the previous version;
- `hold` keeps a freshly compiled rule set as the device's pending plan instead of publishing it (manual
  mode, or a device pinned by a rollback): `enforcer apply` publishes it;
- `rollback` publishes an earlier version's content as a new version and pins the device; `apply` unpins;
- `record_status` keeps the latest report of the device's agent (applied version and hash, per-rule
  counters, drift, last error); it is audited when the applied version or the drift state changes. An agent
  numbers its reports (`report_seq`): one numbered at or below the stored one arrived late and changes nothing.

Concurrency: every change of a device's desired state locks the audit log's head first (its event will
append there anyway), then the device's row (FOR UPDATE on PostgreSQL; SQLite's write transaction already
holds the one writer lock): publishers queue in one order, never give out one version number twice, and the
reconciler can check under that lock that nothing it did not see was committed meanwhile. A status report
that changes only counters takes no log lock (it writes no event), so agents' reports never queue behind a
publication.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import func
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.models import AuditEvent
from audit.service import lock_head
from core.clock import as_utc
from core.errors import Conflict, InvalidInput, NotFound
from enforcer.compiler import Budget
from enforcer.fairshare import entry_label, parse_label
from enforcer.ir import DeviceRuleSet
from enforcer.models import DeviceState, RuleSetVersion
from enforcer.plan import summary as plan_summary

DEVICE_PATTERN = r"^(nic|leaf):[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_DEVICE_RE = re.compile(DEVICE_PATTERN)
MAX_COUNTERS = 10_000
MAX_REPORT_SEQ = 2**63 - 1  # a BIGINT
# How far ahead of the server's clock a report_seq (an agent's wall clock in ns) may be. Without a bound one report
# numbered near MAX_REPORT_SEQ (a buggy or compromised agent) left no number above it: every later report of the
# device was stale for good, and the agent's floor (stored + 1) was itself refused. Bounded, a stored number is at
# most this far ahead, and the agent's floor logic goes above it at once (stored + 1 is within the bound a moment
# later), whatever the bound: so it is generous, as it is also how far an agent's clock may run ahead of the server's
# before its reports are refused.
MAX_REPORT_SEQ_AHEAD = timedelta(days=7)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def report_seq_limit(now: datetime) -> int:
    """The highest report_seq the server takes at `now`: its clock in ns since the epoch, plus
    MAX_REPORT_SEQ_AHEAD. A stored number above it (stored before the bound, or the server's clock stepped back by
    more than that) binds no report: it would otherwise hold the device's reports stale for as long."""
    return min(MAX_REPORT_SEQ, (as_utc(now) + MAX_REPORT_SEQ_AHEAD - _EPOCH) // timedelta(microseconds=1) * 1000)


def check_device(device: str) -> str:
    """The device id (`nic:<node>` | `leaf:<name>`), or InvalidInput."""
    if not _DEVICE_RE.fullmatch(device):
        raise InvalidInput(f"device {device!r} must be nic:<node> or leaf:<name>")
    return device


def _row(session: Session, device: str, lock: bool) -> DeviceState | None:
    query = select(DeviceState).where(col(DeviceState.device) == check_device(device))
    if lock:
        lock_head(session)  # the order every writer of desired state takes (module docstring)
        query = query.with_for_update().execution_options(populate_existing=True)
    return session.exec(query).first()


def get_state(session: Session, device: str, *, lock: bool = False) -> DeviceState:
    st = _row(session, device, lock)
    if st is None:
        raise NotFound(f"device {device} has no published rule set (not in the fabric, or never compiled)")
    return st


def states(session: Session) -> dict[str, DeviceState]:
    return {s.device: s for s in session.exec(select(DeviceState).order_by(col(DeviceState.device))).all()}


def version_row(session: Session, device: str, version: int | None = None) -> RuleSetVersion:
    """A device's version (its desired one when `version` is None); NotFound otherwise."""
    if version is None:
        version = get_state(session, device).version
    row = session.exec(select(RuleSetVersion).where(col(RuleSetVersion.device) == device,
                                                    col(RuleSetVersion.version) == version)).first()
    if row is None:
        raise NotFound(f"device {device} has no version {version}")
    return row


def versions(session: Session, device: str, *, limit: int | None = None, before: int | None = None
             ) -> list[dict[str, Any]]:
    """The versions published for `device`, newest first, without the IR: all of them (`enforcer versions`),
    or a page of `limit` below version `before` (GET /v1/devices/{device}/versions); NotFound for a device
    that never had one."""
    get_state(session, check_device(device))
    v = RuleSetVersion
    query = sa_select(col(v.version), col(v.content_hash), col(v.cause), col(v.published_by),
                      col(v.created_at)).where(col(v.device) == device)
    if before is not None:
        query = query.where(col(v.version) < before)
    rows = session.connection().execute(query.order_by(col(v.version).desc()).limit(limit)).all()
    return [{"device": device, "version": version, "content_hash": digest, "cause": cause, "published_by": by,
             "published_at": as_utc(at)} for version, digest, cause, by, at in rows]


def ruleset_of(row: RuleSetVersion) -> DeviceRuleSet:
    return DeviceRuleSet.from_dict(json.loads(row.ir))


def desired(session: Session) -> dict[str, DeviceRuleSet]:
    """The desired rule set of every device in the fabric (its latest published version)."""
    rows = session.exec(
        select(RuleSetVersion).join(DeviceState, col(DeviceState.device) == col(RuleSetVersion.device))
        .where(col(RuleSetVersion.version) == col(DeviceState.version), col(DeviceState.in_fabric).is_(True))
    ).all()
    return {r.device: ruleset_of(r) for r in rows}


def last_applied(session: Session) -> dict[str, DeviceRuleSet]:
    """What each device in the fabric last reported applied; its desired set when it never reported one."""
    out = desired(session)
    for st in states(session).values():
        if st.in_fabric and st.applied_version is not None and st.applied_version != st.version:
            out[st.device] = ruleset_of(version_row(session, st.device, st.applied_version))
    return out


def _previous(session: Session, st: DeviceState | None, known: Mapping[str, DeviceRuleSet]) -> DeviceRuleSet | None:
    if st is None or st.version == 0:
        return None
    hit = known.get(st.device)
    if hit is not None and hit.content_hash == st.content_hash:
        return hit
    return ruleset_of(version_row(session, st.device, st.version))


def publish(session: Session, rs: DeviceRuleSet, *, cause: str, actor: Actor, now: datetime, budget: Budget,
            known: Mapping[str, DeviceRuleSet] | None = None, pin: bool | None = None, action: str = "enforcer.publish",
            request_id: str | None = None, withheld: list[dict[str, Any]] | None = None) -> RuleSetVersion | None:
    """Publish `rs` as the device's next version unless it already is the desired one (None then; a pin
    change is still recorded). `known`: rule sets the caller holds (the previous compile), to skip reading
    the previous version back for the plan summary. `pin`: True pins, False unpins, None leaves it.
    `withheld`: what `rs` withholds to fit the device's budget (enforcer.fairshare), for the event."""
    device = rs.device
    st = _row(session, device, lock=True)
    if st is not None and st.content_hash == rs.content_hash and st.in_fabric:
        changed = pin is not None and st.pinned != pin
        if changed or st.pending_hash is not None:
            st.pinned = st.pinned if pin is None else pin
            st.pending_hash, st.updated_at = None, now
            session.add(st)
            if changed:
                record(session, actor=actor, action="enforcer.pin" if pin else "enforcer.unpin", object_type="device",
                       object_id=device, summary={"version": st.version, "pinned": st.pinned}, reason=cause[:2000],
                       request_id=request_id, at=now)
        return None
    previous = _previous(session, st, known or {})
    if st is None:
        st = DeviceState(device=device, kind=rs.kind, version=0, updated_at=now)
    row = RuleSetVersion(device=device, version=st.version + 1, content_hash=rs.content_hash,
                         ir=rs.canonical.decode(), cause=cause[:500], published_by=actor.id, created_at=now)
    session.add(row)
    st.version, st.content_hash, st.pending_hash, st.in_fabric, st.updated_at = (
        row.version, rs.content_hash, None, True, now)
    if pin is not None:
        st.pinned = pin
    session.add(st)
    session.flush()
    summary = plan_summary(previous, rs, budget)
    summary.update(version=row.version, pinned=st.pinned)
    if withheld:
        summary["withheld"] = withheld
    record(session, actor=actor, action=action, object_type="device", object_id=device, summary=summary,
           reason=cause[:2000], request_id=request_id, at=now)
    return row


def hold(session: Session, rs: DeviceRuleSet, *, why: str, actor: Actor, now: datetime) -> bool:
    """Keep `rs` as the device's pending plan instead of publishing it; True when that changed anything."""
    device = rs.device
    st = _row(session, device, lock=True)
    pending = None if st is not None and st.content_hash == rs.content_hash else rs.content_hash
    if st is None:
        st = DeviceState(device=device, kind=rs.kind, version=0, updated_at=now)
    elif st.pending_hash == pending:
        return False
    st.pending_hash, st.updated_at = pending, now
    session.add(st)
    session.flush()
    record(session, actor=actor, action="enforcer.hold", object_type="device", object_id=device,
           summary={"version": st.version, "content_hash": st.content_hash, "pending_hash": pending, "why": why},
           at=now)
    return True


def retire(session: Session, device: str, *, actor: Actor, now: datetime, cause: str) -> None:
    """The device left the fabric: nothing is desired of it any more (its versions stay, for the record)."""
    st = get_state(session, device, lock=True)
    if not st.in_fabric:
        return
    st.in_fabric, st.pending_hash, st.updated_at = False, None, now
    session.add(st)
    session.flush()
    record(session, actor=actor, action="enforcer.retire", object_type="device", object_id=device,
           summary={"version": st.version}, reason=cause[:2000], at=now)


def rollback(session: Session, device: str, to_version: int, *, actor: Actor, now: datetime, budget: Budget,
             reason: str | None = None, request_id: str | None = None) -> RuleSetVersion:
    """Publish version `to_version`'s content as a new version and pin the device there (automatic
    publication leaves it alone until `apply` unpins it)."""
    st = get_state(session, device, lock=True)
    if not st.in_fabric:
        raise Conflict(f"device {device} is no longer in the fabric")
    if not 1 <= to_version < st.version:
        raise InvalidInput(f"--to must be an earlier version of {device} (1..{st.version - 1}), not {to_version}")
    target = ruleset_of(version_row(session, device, to_version))
    cause = f"rollback to version {to_version}" + (f": {reason}" if reason else "")
    row = publish(session, target, cause=cause, actor=actor, now=now, budget=budget, pin=True,
                  action="enforcer.rollback", request_id=request_id)
    if row is None:  # the content is the desired one already: the pin was recorded
        return version_row(session, device)
    _rolled_back_withheld(session, device, target.content_hash, actor=actor, now=now, cause=cause,
                          request_id=request_id)
    return row


def _rolled_back_withheld(session: Session, device: str, content_hash: str, *, actor: Actor, now: datetime,
                          cause: str, request_id: str | None) -> None:
    """After a rollback, what the device's published set withholds is what the rolled-back-to content withheld
    when it was published (the last enforcer.withhold event naming its hash; none: nothing), not what the set
    rolled back from withheld: `enforcer status`, the device API and explain read the last event. Recorded only
    when it differs from the last one."""
    rows = session.connection().execute(
        sa_select(col(AuditEvent.summary)).where(col(AuditEvent.action) == "enforcer.withhold",
                                                col(AuditEvent.object_id) == device)
        .order_by(col(AuditEvent.seq).desc())).all()
    last = dict(rows[0][0]) if rows else {}
    then = next((dict(r[0]) for r in rows if r[0].get("hash") == content_hash), None)
    want = then if then is not None else {"device": device, "withheld": [], "hash": content_hash}

    def flows(summary: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
        return [(w["tenant"], w["flows"]) for w in summary.get("withheld", [])]

    if flows(want) == flows(last):
        return
    record(session, actor=actor, action="enforcer.withhold", object_type="device", object_id=device, summary=want,
           reason=f"{cause}: {'the withholding of that version' if flows(want) else 'nothing withheld'}"[:2000],
           request_id=request_id, at=now)


class StatusRecorded(NamedTuple):
    state: DeviceState
    audited: bool  # the report changed what is audited, and its event is recorded
    stale: bool  # numbered at or below the stored report: nothing changed, nothing recorded


def record_status(session: Session, device: str, report: Mapping[str, Any], *, actor: Actor, now: datetime,
                  request_id: str | None = None) -> StatusRecorded:
    """Store the agent's latest report. The report names a version the device was given and its content hash
    (anything else is InvalidInput); counters are {key: {packets, bytes}}. A report with a `report_seq` not above
    the stored one is stale (a request that reached the server after a newer report: a timed-out one processed
    after its retry, an old agent process's last one): it changes nothing and records no event. A report without
    one (an agent from before numbering) is stored as it comes. A report_seq more than MAX_REPORT_SEQ_AHEAD ahead of
    `now` is InvalidInput (report_seq_limit)."""
    st = get_state(session, device)
    version, digest = report.get("applied_version"), report.get("applied_hash")
    if version is not None:
        row = version_row(session, device, int(version))
        if digest != row.content_hash:
            raise InvalidInput(f"applied_hash does not match version {version} of {device} ({row.content_hash})")
    elif digest is not None:
        raise InvalidInput("applied_hash needs applied_version")
    seq = report.get("report_seq")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_REPORT_SEQ):
        raise InvalidInput(f"report_seq must be an integer from 1 to {MAX_REPORT_SEQ}")
    limit = report_seq_limit(now)
    if seq is not None and seq > limit:
        days = MAX_REPORT_SEQ_AHEAD.days
        raise InvalidInput(f"report_seq {seq} is more than {days} days ahead of the server's clock (at most {limit} ns "
                           "since the epoch): the agent's clock is ahead")
    counters = dict(report.get("counters") or {})
    if len(counters) > MAX_COUNTERS:
        raise InvalidInput(f"at most {MAX_COUNTERS} counters per report")
    drift = [str(x)[:500] for x in report.get("drift") or []][:200]
    repaired = bool(report.get("drift_repaired"))
    error = report.get("last_error")
    after = (version, digest, bool(drift), repaired, error)

    def state_of(st: DeviceState) -> tuple[Any, ...]:
        return (st.applied_version, st.applied_hash, bool(st.drift), st.drift_repaired, st.last_error)

    def stale(st: DeviceState) -> bool:  # a stored seq above the limit binds nothing (report_seq_limit)
        return seq is not None and st.report_seq is not None and seq <= st.report_seq <= limit

    if stale(st):
        return StatusRecorded(st, False, True)
    before = state_of(st)
    locked = before != after  # it will be audited: take the log lock first, then read the row again under it
    if not locked and seq is not None:
        # Counters only, as read without a lock. Claim the seq against the value read, in one statement: it waits
        # for a concurrent writer of the row (PostgreSQL re-checks the condition on the row it committed) and
        # matches nothing if a numbered report was stored since, whose state this one's must not overwrite
        # unread: that goes the locked way below. (SQLite: BEGIN IMMEDIATE already serialized the two.)
        seen = col(DeviceState.report_seq).is_(None) if st.report_seq is None \
            else col(DeviceState.report_seq) == st.report_seq
        claim = sa_update(DeviceState).where(col(DeviceState.device) == device, seen).values(report_seq=seq)
        claimed = session.execute(claim.execution_options(synchronize_session=False))
        locked = claimed.rowcount != 1  # type: ignore[attr-defined]
    if locked:
        st = get_state(session, device, lock=True)
        if stale(st):
            return StatusRecorded(st, False, True)
        before = state_of(st)
    if version != st.applied_version:
        st.applied_at = now
    st.applied_version, st.applied_hash, st.drift, st.drift_repaired = version, digest, drift, repaired
    st.last_error = None if error is None else str(error)[:2000]
    st.counters, st.reported_at, st.updated_at = counters, now, now
    if seq is not None:
        st.report_seq = seq
    session.add(st)
    session.flush()
    audited = before != after
    if audited:
        record(session, actor=actor, action="device.status", object_type="device", object_id=device,
               summary={"applied_version": version, "applied_hash": digest, "desired_version": st.version,
                        "in_sync": digest == st.content_hash, "drift": len(drift), "drift_repaired": repaired,
                        "last_error": st.last_error},
               request_id=request_id, at=now)
    return StatusRecorded(st, audited, False)


def withheld(session: Session, device: str | None = None) -> dict[str, dict[str, Any]]:
    """The last `enforcer.withhold` event's summary of each device that has one (or of `device`): what its published
    rule set withholds to fit its budget (enforcer.fairshare; `withheld` empty: nothing). Kept in the audit log,
    not a column: the event is recorded once per change, in the transaction of the publication."""
    latest = sa_select(func.max(col(AuditEvent.seq))).where(col(AuditEvent.action) == "enforcer.withhold")
    if device is not None:
        latest = latest.where(col(AuditEvent.object_id) == device)
    latest = latest.group_by(col(AuditEvent.object_id))  # the index (action, seq) answers it; one row read per device
    query = sa_select(col(AuditEvent.object_id), col(AuditEvent.summary)).where(col(AuditEvent.seq).in_(latest))
    return {d: dict(summary) for d, summary in session.connection().execute(query).all()}


def withheld_keys(session: Session) -> dict[str, set[tuple[str, str, str]]]:
    """Per device, the entries (keys: dst, proto, reason) its published set withholds (the last enforcer.withhold
    event's), for `enforcer verify` to tell a flow withheld to fit the budget from a device that drifted."""
    out: dict[str, set[tuple[str, str, str]]] = {}
    for device, summary in withheld(session).items():
        keys = {k for w in summary.get("withheld", []) for f in w.get("flows", []) if (k := parse_label(f))}
        if keys:
            out[device] = keys
    return out


def withheld_notes(session: Session, dst: str, proto: str, reasons: Sequence[str]) -> list[str]:
    """For a flow the policy allows to `dst` (tenant/group) for `reasons` (explain's, `grant:<id> allows ...`,
    `intra-tenant: ...`): each device whose published set withholds every entry that allows it, as a note."""
    keys = {entry_label((dst, proto, r.split(" ", 1)[0].removesuffix(":"))) for r in reasons}
    if not keys:
        return []
    return [f"allowed by policy, withheld on {device}: over budget" for device, summary in sorted(
        withheld(session).items()) if keys <= {f for w in summary.get("withheld", []) for f in w.get("flows", [])}]


def status_rows(session: Session) -> list[dict[str, Any]]:
    """Every device: desired vs applied version, pin, pending plan, drift, last apply and report, counters, and
    what its published set withholds to fit its budget."""
    held = withheld(session)
    return [_status(st, held.get(st.device)) for st in states(session).values()]


def status_row(session: Session, device: str) -> dict[str, Any]:
    """One device's status_rows entry; NotFound when it never had a rule set."""
    st = get_state(session, device)
    return _status(st, withheld(session, device).get(device))


def _withheld_row(summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [{k: w[k] for k in ("tenant", "entries", "cost")} for w in (summary or {}).get("withheld", [])]


def _status(st: DeviceState, held: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "device": st.device, "kind": st.kind, "in_fabric": st.in_fabric, "desired_version": st.version,
        "desired_hash": st.content_hash, "pinned": st.pinned, "pending_hash": st.pending_hash,
        "applied_version": st.applied_version, "applied_hash": st.applied_hash,
        "in_sync": st.applied_hash is not None and st.applied_hash == st.content_hash,
        "applied_at": as_utc(st.applied_at) if st.applied_at else None,
        "reported_at": as_utc(st.reported_at) if st.reported_at else None,
        "drift": list(st.drift), "drift_repaired": st.drift_repaired, "last_error": st.last_error,
        "counters": dict(st.counters), "report_seq": st.report_seq,
        "withheld": _withheld_row(held) if st.in_fabric else [],
    }
