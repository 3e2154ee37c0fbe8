"""Grant lifecycle: request -> policy decision -> (approve | reject) -> active -> expired | revoked.

States: pending -> active -> expired | revoked, or pending -> rejected | expired (approval timed out),
or denied at request time. `expires_at` / `pending_until` are authoritative: `effective_state` reports
a grant past them as expired on every read, before the sweeper persists it. Every change writes its
audit event in the caller's session, and every state change is a compare-and-set on `Grant.version`,
so of two concurrent approvals exactly one wins and the other gets Conflict.

The decision itself comes from `rego/grants.rego` through a `GrantDecider` the caller supplies (the
API composes it from the policy engine); a decider that raises denies the request (fail closed).
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, event, func, or_, update
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.service import head_locked, lock_head_and_check
from core.clock import Clock, as_utc, format_ttl, system_clock
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from core.quotas import QuotaName, Quotas
from core.rocev2 import includes_rocev2
from core.vocabulary import FINAL_GRANT_STATES
from policy import decisionlog, rocev2
from policy.data import forget_decision_state, marker_for_decision, take_data_version_now
from policy.models import Grant
from store import deferred
from store.carried import CarriedCheck
from store.db import DriverInsert, driver_rows, driver_write, driver_write_batches, driver_write_many, placeholder
from store.groupcommit import RowLock, note_held

log = logging.getLogger("trustfabric.policy.grants")

OUTCOMES = ("approve", "pending", "deny")
FINAL_STATES = FINAL_GRANT_STATES
DEFAULT_PENDING_TTL = timedelta(days=3)
MAX_PAGE = 200


_TIME_FIELDS = ("created_at", "decided_at", "expires_at", "pending_until")


@event.listens_for(Grant, "load")
@event.listens_for(Grant, "refresh")
def _aware_times(target: Grant, *_args: Any) -> None:
    """SQLite hands back naive datetimes; a Grant always carries timezone-aware UTC ones."""
    for name in _TIME_FIELDS:
        value = target.__dict__.get(name)
        if isinstance(value, datetime) and value.tzinfo is None:
            set_committed_value(target, name, as_utc(value))


class GrantNotFound(NotFound):
    pass


class GrantConflict(Conflict):
    pass


@dataclass(frozen=True)
class GrantRequest:
    src_tenant: str
    src_group: str
    dst_tenant: str
    dst_group: str
    proto: str
    ports: Sequence[int]
    ttl_seconds: int
    justification: str = ""

    def policy_input(self, requester_tenant: str) -> dict[str, Any]:
        return {
            "requester": {"tenant": requester_tenant},
            "src": {"tenant": self.src_tenant, "group": self.src_group},
            "dst": {"tenant": self.dst_tenant, "group": self.dst_group},
            "proto": self.proto,
            "ports": list(self.ports),
            "ttl_seconds": self.ttl_seconds,
        }

    def same_as(self, grant: Grant) -> bool:
        return (
            grant.src_tenant == self.src_tenant and grant.src_group == self.src_group
            and grant.dst_tenant == self.dst_tenant and grant.dst_group == self.dst_group
            and grant.proto == self.proto and list(grant.ports) == list(self.ports)
            and grant.ttl_seconds == self.ttl_seconds and grant.justification == self.justification
        )


@dataclass(frozen=True)
class GrantDecision:
    outcome: str  # approve | pending | deny
    approvers: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    policy_hash: str | None = None  # the policy version that decided (for the decision log)

    @classmethod
    def from_document(cls, doc: Any) -> GrantDecision:
        """A decision document from grants.rego; anything malformed is a deny (fail closed)."""
        if not isinstance(doc, dict) or doc.get("outcome") not in OUTCOMES:
            return cls("deny", [], [f"engine-error: malformed decision {doc!r:.200}"])
        approvers = [str(a) for a in doc.get("approvers") or []]
        reasons = [str(r) for r in doc.get("reasons") or []]
        if doc["outcome"] == "pending" and not approvers:
            return cls("deny", [], ["engine-error: pending decision without approvers", *reasons])
        return cls(str(doc["outcome"]), approvers, reasons)


# (session, now, policy input) -> decision; the API builds it from the policy engine.
GrantDecider = Callable[[Session, datetime, dict[str, Any]], GrantDecision]


@dataclass(frozen=True)
class Caller:
    """Who acts on a grant: id, role and (for tenant roles) tenant, all from the authenticated principal. The id
    alone names no one: API token subjects are free text, so acme's and globex's `alice` are both `alice`; the
    requester is (requester_tenant, id)."""

    id: str
    role: str
    tenant: str | None
    actor: Actor

    @property
    def requester_tenant(self) -> str:
        """The tenant the caller is confined to, '' for a platform role: with the id, whose grant requests (and
        Idempotency-Keys) are whose (never NULL: NULLs are distinct in a UNIQUE constraint)."""
        return self.tenant if self.tenant is not None else ""

    @property
    def approver_names(self) -> set[str]:
        if self.role == "security":
            return {"security"}
        if self.role == "tenant-admin" and self.tenant:
            return {f"tenant-admin:{self.tenant}"}
        return set()


def new_grant_id(now: datetime) -> str:
    """Time-ordered id (so cursor paging by id is chronological): g-<ms hex>-<random hex>."""
    return f"g-{int(now.timestamp() * 1000):012x}-{secrets.token_hex(8)}"


_GRANT_FIELDS = frozenset(Grant.model_fields)
_MAPPER = Grant.__mapper__  # type: ignore[attr-defined]
_new_instance = Grant._sa_class_manager.new_instance  # type: ignore[attr-defined]


def new_grant(**values: Any) -> Grant:
    """A transient Grant of `values` (every field), made as the ORM makes an object it loads (the class's __new__
    and the ORM's instance state) with the values put in its __dict__, not through SQLModel's __init__, which sets
    each field through its instrumented attribute: ~35 us where this takes ~2, on every grant request. A table
    model's __init__ validates nothing, so nothing is lost; a missing or unknown field is a TypeError."""
    if values.keys() != _GRANT_FIELDS:
        raise TypeError(f"a Grant needs exactly its fields: {sorted(values.keys() ^ _GRANT_FIELDS)}")
    if not _MAPPER.configured:  # as a model's first __init__ would (its attributes are set up then)
        configure_mappers()
    grant: Grant = _new_instance()
    grant.__dict__.update(values)
    object.__setattr__(grant, "__pydantic_fields_set__", set(_GRANT_FIELDS))  # as __init__ leaves it: all set
    return grant


def effective_state(grant: Grant, now: datetime) -> str:
    """The state at `now`, to the second: an active grant past expires_at is expired, as is a pending
    grant past pending_until, whatever the stored state says."""
    if grant.state == "active" and grant.expires_at is not None and as_utc(grant.expires_at) <= now:
        return "expired"
    if grant.state == "pending" and grant.pending_until is not None and as_utc(grant.pending_until) <= now:
        return "expired"
    return grant.state


def is_active(grant: Grant, now: datetime) -> bool:
    return effective_state(grant, now) == "active"


def _cas(session: Session, grant: Grant, **values: Any) -> Grant:
    """Compare-and-set on version: the update applies only if nobody changed the grant since we read it."""
    result = session.execute(
        update(Grant)
        .where(col(Grant.id) == grant.id, col(Grant.version) == grant.version)
        .values(version=grant.version + 1, **values)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise GrantConflict(f"grant {grant.id} was changed concurrently; read it again and retry")
    session.expire(grant)
    fresh = session.get(Grant, grant.id)
    assert fresh is not None
    return fresh


def decide_closed(
    decide: GrantDecider, session: Session, now: datetime, policy_input: dict[str, Any]
) -> GrantDecision:
    """The decider's answer; any failure of it is a denial that says why (fail closed). A database error is
    not the decider's: it propagates, so the request fails whole (503) instead of storing a denial that only
    says the database was away (found by tests/api/test_replicas.py's PostgreSQL restart)."""
    try:
        return decide(session, now, policy_input)
    except (DBAPIError, PendingRollbackError):
        raise
    except Exception as exc:
        log.exception("grant decision failed")
        return GrantDecision("deny", [], [f"engine-error: {type(exc).__name__}: {exc}"[:500]])


def seen_by(session: Session, caller: Caller, request: GrantRequest, decision: GrantDecision) -> GrantDecision:
    """The decision as the asking tenant may see it: reasons about the other tenant's inventory only when it
    holds a grant naming that group (policy/disclosure.py); a platform caller sees it whole."""
    if caller.tenant is None:
        return decision
    from policy.disclosure import grant_reasons_for

    shown = grant_reasons_for(session, caller.tenant, (request.dst_tenant, request.dst_group), decision.outcome,
                              decision.reasons)
    if shown == decision.reasons:
        return decision
    return GrantDecision(decision.outcome, decision.approvers, shown, decision.policy_hash)


# A grant opens its flows when active, and will once approved when pending; a live answer (explain-grant) would
# open them unless it is a denial (`undisclosed` may be either: its note, worked out from the request alone,
# discloses nothing about the destination).
_OPENING = frozenset({"pending", "active", "approve", "undisclosed"})


def grant_notes(grant: GrantRequest | Grant, state: str) -> list[str]:
    """What the devices add to the flows of `grant` in `state` (a grant's effective state, or the outcome of a
    live answer): its RoCEv2 mirror (policy/rocev2.py), for both sides to read beside the policy's reasons."""
    if state not in _OPENING or not includes_rocev2(grant.proto, grant.ports):  # the list's hot path: no strings
        return []
    return rocev2.grant_notes(f"{grant.src_tenant}/{grant.src_group}", f"{grant.dst_tenant}/{grant.dst_group}",
                        grant.proto, grant.ports)


def explain_request(
    session: Session, request: GrantRequest, *, caller: Caller, decide: GrantDecider, now: datetime
) -> tuple[GrantDecision, dict[str, Any]]:
    """(the decision request_grant would make now, the policy input it was made on), without making it:
    the same scope rule, input and decider, and nothing is written (no grant, no audit event). A tenant sees
    it as policy.disclosure.grant_preview_for allows: `undisclosed` when it depends on another tenant's group
    the tenant holds no grant with."""
    if caller.tenant is not None and request.src_tenant != caller.tenant:
        raise Forbidden(f"tenant {caller.tenant} may only request grants for its own groups")
    policy_input = request.policy_input(caller.tenant if caller.tenant is not None else request.src_tenant)
    decision = decide_closed(decide, session, now, policy_input)
    if caller.tenant is None:
        return decision, policy_input
    from policy.disclosure import grant_preview_for

    outcome, shown = grant_preview_for(session, caller.tenant, (request.dst_tenant, request.dst_group),
                                       decision.outcome, decision.reasons)
    # undisclosed: nor who would approve (a sensitive group adds security)
    approvers = decision.approvers if outcome == decision.outcome else []
    return GrantDecision(outcome, approvers, shown, decision.policy_hash), policy_input


@dataclass(frozen=True)
class PreparedGrant:
    """A grant request decided, not yet written: `commit_request` writes it (in the same transaction, or in a
    later write transaction: a group commit). `marker` is the audit log's size before anything the decision
    read was read: every change since then has its event at or after it (see `commit_request`)."""

    request: GrantRequest
    grant: Grant  # transient: added to no session yet
    decision: GrantDecision
    marker: int


class StaleDecision(GrantConflict):
    """A change that may alter the decision (not a grant's own lifecycle, nor an issuance) committed between the
    decision and its write: the caller decides again."""


# Events after which a decision made before them still holds: the lifecycle of other grants (as when deciding
# and writing in one READ COMMITTED transaction, which never serialised two grant requests' decisions) and
# identity issuance, which changes no policy data. Anything else (a quarantine, a policy activation, a
# revocation, an inventory change) makes a prepared decision stale.
_DECISION_KEEPING_EVENTS = ("grant.", "svid.issue", "svid.jwt.issue")


def prepare_request(
    session: Session,
    request: GrantRequest,
    *,
    caller: Caller,
    decide: GrantDecider,
    idempotency_key: str | None = None,
    pending_ttl: timedelta = DEFAULT_PENDING_TTL,
    clock: Clock = system_clock,
    max_ttl: timedelta | None = None,
    carried: Sequence[CarriedCheck] = (),
) -> Grant | PreparedGrant:
    """Everything request_grant does before it writes: the earlier grant of a retry with the same
    Idempotency-Key (returned as is), or the request checked and decided (read only; a read transaction will
    do). Same errors as request_grant. `carried`: the caller's checks still to make (store/carried.py: its token's
    row), read in the first statement and settled before anything else is done."""
    # the marker (with the decider's first read) and, with a key, the id of a grant already requested under it: one
    # statement (a request with a key paid a round trip of its own for the lookup, the usual miss included)
    marker, earlier = marker_for_decision(
        session, None if idempotency_key is None else _earlier_grant(session, caller, idempotency_key), carried)
    if earlier is not None:
        forget_decision_state(session)
        previous = session.get(Grant, earlier)
        if previous is not None:
            if not request.same_as(previous):
                raise GrantConflict("Idempotency-Key was already used for a different grant request")
            return previous
    if caller.tenant is not None and request.src_tenant != caller.tenant:
        raise Forbidden(f"tenant {caller.tenant} may only request grants for its own groups")
    if max_ttl is not None and request.ttl_seconds > max_ttl.total_seconds():
        # grants.rego denies it too; the code does not rely on whichever version is active to say so
        # in the units `--ttl` and the console take too (a CLI user asked for `90d`, not 7776000 s)
        limit = int(max_ttl.total_seconds())
        raise InvalidInput(f"ttl_seconds {request.ttl_seconds} ({format_ttl(request.ttl_seconds)}) is above the "
                           f"maximum grant TTL of {limit} s ({format_ttl(limit)})")
    now = clock()
    requester_tenant = caller.tenant if caller.tenant is not None else request.src_tenant
    try:
        decided = decide_closed(decide, session, now, request.policy_input(requester_tenant))
    finally:
        forget_decision_state(session)
    decision = seen_by(session, caller, request, decided)
    state = {"approve": "active", "pending": "pending", "deny": "denied"}[decision.outcome]
    grant = new_grant(
        id=new_grant_id(now),
        src_tenant=request.src_tenant, src_group=request.src_group,
        dst_tenant=request.dst_tenant, dst_group=request.dst_group,
        proto=request.proto, ports=list(request.ports), justification=request.justification,
        ttl_seconds=request.ttl_seconds, state=state, requested_by=caller.id,
        requester_tenant=caller.requester_tenant, idempotency_key=idempotency_key,
        required_approvers=sorted(set(decision.approvers)) if state == "pending" else [],
        approvals=[], reasons=list(decision.reasons), created_at=now,
        decided_at=now if state != "pending" else None,
        expires_at=now + timedelta(seconds=request.ttl_seconds) if state == "active" else None,
        pending_until=now + pending_ttl if state == "pending" else None, version=1,
    )
    return PreparedGrant(request, grant, decision, marker)


def commit_request(
    session: Session,
    prepared: PreparedGrant,
    *,
    caller: Caller,
    quotas: Quotas | None = None,
    request_id: str | None = None,
    recheck: bool = True,
    decision_record: decisionlog.DecisionRow | None = None,
) -> Grant:
    """Write a prepared grant and its audit event (and `decision_record`, the decision log's row, with the
    grant). With `recheck` (the decision was read in another transaction), every event since the decision's
    marker is looked at under the head lock, just before this request's own event: one that may change the
    decision raises StaleDecision and nothing is written. The quota is counted here, under the tenant row's
    lock, so concurrent requests never pass its last free place together."""
    grant, request, decision = prepared.grant, prepared.request, prepared.decision
    counted = grant.state != "denied" and _check_quota(session, quotas, request.src_tenant, grant.state,
                                                       as_utc(grant.created_at))
    _insert(session, grant, decision_record, queue=not counted)  # a counted state's rows at once: the next
    # member's count must see them
    if recheck and not deferred.later(session, lambda: _still_holds(session, prepared.marker, request.src_tenant)):
        _still_holds(session, prepared.marker, request.src_tenant)  # under the head lock (deferred: after every
        # member's change)
    record(
        session, actor=caller.actor, action="grant.request", object_type="grant", object_id=grant.id,
        tenant=request.src_tenant,
        summary={
            "src": f"{request.src_tenant}/{request.src_group}", "dst": f"{request.dst_tenant}/{request.dst_group}",
            "proto": request.proto, "ports": list(request.ports), "ttl_seconds": request.ttl_seconds,
            "outcome": decision.outcome, "state": grant.state, "approvers": grant.required_approvers,
        },
        reason="; ".join(decision.reasons)[:2000] or None, request_id=request_id, at=as_utc(grant.created_at),
    )
    return grant


HEAD_HELD_LOCK_WAIT_MS = 20  # the longest a grant's INSERT under the audit head's lock waits for a lock (_insert_rows)
_GRANTS = Grant.__table__  # type: ignore[attr-defined]
_GRANT_COLUMNS = tuple(c.name for c in _GRANTS.columns)
_INSERT_GRANT = _GRANTS.insert()
_PG_INSERT_GRANT = DriverInsert(_GRANTS)
_PG_INSERT_GRANT_AND_DECISION = decisionlog.INSERT_CTE_SQL + _PG_INSERT_GRANT.sql
# the id of the grant a caller (its tenant and id) requested under an Idempotency-Key (unique together: one row at
# most), as a scalar subquery in the SQL of each driver (store.db.placeholder's marks), sent on the driver's cursor
_EARLIER_GRANT = {
    mark: f"(SELECT id FROM {_GRANTS.name} WHERE requester_tenant = {mark} AND requested_by = {mark} "  # noqa: S608
          f"AND idempotency_key = {mark})"
    for mark in ("?", "%s")}  # (the table's own name; the values are parameters)


def _insert(session: Session, grant: Grant, decision: decisionlog.DecisionRow | None = None, *,
            queue: bool = False) -> None:
    """INSERT the new grant as one Core statement (no unit-of-work flush: it cost a fifth of a grant write's
    CPU and bought nothing for one new row), and its decision record (policy/decisionlog.py) with it: on
    PostgreSQL in the same statement, as a data-modifying CTE (a round trip fewer). The objects stay out of
    the session: a rollback expires what a session holds, and the group committer runs a failed batch's items
    again with the same prepared grant. With `queue`, in a group commit that batches rows (store/deferred.py),
    the rows are queued and the batch's written together (one round trip), before the audit head's lock."""
    rows: list[tuple[Grant, decisionlog.DecisionRow | None]] | None = (
        deferred.batched(session, "policy.grants", list, lambda queued: _insert_rows(session, queued))
        if queue else None)
    if rows is None:
        _insert_rows(session, [(grant, decision)])
    else:
        rows.append((grant, decision))


def _insert_rows(session: Session, rows: list[tuple[Grant, decisionlog.DecisionRow | None]]) -> None:
    _write_rows(session, rows)
    if any(g.state == "active" for g, _d in rows):  # the trigger updated the data version's row: it is locked now
        note_held(session, DATA_VERSION_ROW.name)


def _write_rows(session: Session, rows: list[tuple[Grant, decisionlog.DecisionRow | None]]) -> None:
    conn = session.connection()
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":  # on the driver's cursor
        alone = [_PG_INSERT_GRANT.values(g) for g, d in rows if d is None]
        logged = [{**_PG_INSERT_GRANT.values(g), **decisionlog.PG_INSERT.values(d)} for g, d in rows if d is not None]
        batches = [(sql, params) for sql, params in ((_PG_INSERT_GRANT.sql, alone),
                                                     (_PG_INSERT_GRANT_AND_DECISION, logged)) if params]
        if head_locked(session) and any(g.idempotency_key is not None for g, _d in rows):
            # written under the head's lock (a group commit's late members): an Idempotency-Key another transaction
            # inserted and has not committed would make this INSERT wait for it, while it waits for the head
            driver_write_batches(conn, batches, lock_timeout_ms=HEAD_HELD_LOCK_WAIT_MS)
            return
        for sql, params in batches:
            if len(params) == 1:
                driver_write(conn, sql, params[0])
            else:
                driver_write_many(conn, sql, params)
        return
    conn.execute(_INSERT_GRANT, [{name: getattr(g, name) for name in _GRANT_COLUMNS} for g, _d in rows])
    for _g, decision in rows:
        if decision is not None:
            decisionlog.add(session, decision)


def _still_holds(session: Session, marker: int, tenant: str) -> None:
    """StaleDecision unless every event from `marker` to the (now locked) head keeps a decision made before it
    (read with the lock, and with the counters of the grant.request event that follows: one round trip)."""
    _size, changed = lock_head_and_check(session, marker, _DECISION_KEEPING_EVENTS,
                                         upcoming=[(tenant, "grant.request")])
    if changed is not None:
        raise StaleDecision(f"the decision is stale: {changed} committed meanwhile; decide again")


def request_grant(
    session: Session,
    request: GrantRequest,
    *,
    caller: Caller,
    decide: GrantDecider,
    idempotency_key: str | None = None,
    pending_ttl: timedelta = DEFAULT_PENDING_TTL,
    clock: Clock = system_clock,
    request_id: str | None = None,
    quotas: Quotas | None = None,
    max_ttl: timedelta | None = None,
) -> tuple[Grant, bool]:
    """Record a request and its decision; returns (grant, created). A retry with the same Idempotency-Key
    and the same request returns the first grant unchanged; the same key with a different request is
    a Conflict. With `quotas`, a request that would take the source tenant past its active-grant or
    pending-request quota is QuotaExceeded (409), and with `max_ttl` a longer TTL is InvalidInput (400):
    nothing is written either way. Decided and written in the caller's one transaction (prepare_request then
    commit_request; the API group-commits the second half instead)."""
    prepared = prepare_request(session, request, caller=caller, decide=decide, idempotency_key=idempotency_key,
                               pending_ttl=pending_ttl, clock=clock, max_ttl=max_ttl)
    if isinstance(prepared, Grant):
        return prepared, False
    return commit_request(session, prepared, caller=caller, quotas=quotas, request_id=request_id,
                          recheck=False), True


def get_grant(session: Session, grant_id: str, *, viewer_tenant: str | None) -> Grant:
    """The grant, or GrantNotFound; a tenant sees only grants where it is source or destination."""
    grant = session.get(Grant, grant_id) if len(grant_id) <= 36 else None
    if grant is None or (viewer_tenant is not None and viewer_tenant not in (grant.src_tenant, grant.dst_tenant)):
        raise GrantNotFound(f"grant {grant_id!r} not found")
    return grant


def _usable(grant: Grant, now: datetime, action: str) -> None:
    state = effective_state(grant, now)
    if state != "pending":
        raise GrantConflict(f"grant {grant.id} is {state}; only a pending grant can be {action}")


def request_of(grant: Grant) -> GrantRequest:
    return GrantRequest(
        src_tenant=grant.src_tenant, src_group=grant.src_group, dst_tenant=grant.dst_tenant,
        dst_group=grant.dst_group, proto=grant.proto, ports=list(grant.ports), ttl_seconds=grant.ttl_seconds,
        justification=grant.justification,
    )


def _check_quota(session: Session, quotas: Quotas | None, tenant: str, state: str, now: datetime) -> bool:
    """QuotaExceeded when one more `state` (active | pending) grant would take `tenant` past its quota; whether a
    quota counted it. The COUNT is built only when a quota is set (building it cost more than the rest of the
    check)."""
    from inventory.service import check_quota

    name = _counted_quota(quotas, state)
    if name is None:
        return False
    held = select(func.count()).select_from(Grant).where(col(Grant.src_tenant) == tenant, _state_filter(state, now))
    check_quota(session, quotas, tenant, name, held)
    return True


def _counted_quota(quotas: Quotas | None, state: str) -> QuotaName | None:
    """The quota a new grant in `state` (active | pending) counts against, when one is set."""
    name: QuotaName = "grants" if state == "active" else "pending"
    return name if quotas is not None and getattr(quotas, name) > 0 else None


# The policy data version's row (schema step 9): an active grant's INSERT updates it (its trigger), a row lock.
DATA_VERSION_ROW = RowLock("policy_data_version", take_data_version_now)


def late_join(prepared: PreparedGrant, quotas: Quotas | None) -> bool | RowLock:
    """How a group commit may run commit_request for this grant after its batch took the audit head's lock
    (store/groupcommit.py, submit's `late`). False when it counts a quota: its tenant's row lock, which must come
    before the head's (the next batch). DATA_VERSION_ROW for an active grant: its INSERT updates the policy data
    version's row (step 9's trigger), so it joins only a batch holding that row already or taking it without a wait.
    Waiting for it under the head deadlocked with another replica's batch of active grants (or any change of the policy
    data) holding the row and waiting for the head: PostgreSQL broke the cycle after deadlock_timeout (1 s), or, for a
    grant with an Idempotency-Key, its lock_timeout failed the batch after 20 ms and every member ran again alone.
    True otherwise: it only reads and inserts. Its INSERT can still meet the same requester's Idempotency-Key
    inserted by a transaction not yet committed, which waits for that head: written under the head, it waits
    HEAD_HELD_LOCK_WAIT_MS at most and then fails its batch, whose members are run again alone (_insert_rows),
    instead of a deadlock PostgreSQL breaks after a second."""
    state = prepared.grant.state
    if state != "denied" and _counted_quota(quotas, state) is not None:
        return False
    return DATA_VERSION_ROW if state == "active" else True


def _decide_again(session: Session, grant: Grant, decide: GrantDecider, now: datetime) -> GrantDecision:
    """The policy in force, asked again about a pending request (fail closed: an error denies)."""
    return decide_closed(decide, session, now, request_of(grant).policy_input(grant.src_tenant))


def approve_grant(
    session: Session, grant_id: str, *, caller: Caller, clock: Clock = system_clock,
    request_id: str | None = None, comment: str = "", decide: GrantDecider | None = None,
    quotas: Quotas | None = None,
) -> Grant:
    """Add the caller's approval; when every named approver has approved, the grant becomes active.

    With `decide`, the approval that would activate the grant first asks the policy in force again:
    what happened since the request (a quarantine, a port no longer exposed, a stricter version) is
    not waved through. A deny refuses the approval (GrantConflict with the reasons, nothing written);
    approvers the policy now names on top of the original ones (the destination became sensitive) are
    added, and the grant stays pending until they approve too."""
    now = clock()
    grant = get_grant(session, grant_id, viewer_tenant=caller.tenant)
    if caller.tenant is not None and caller.tenant == grant.src_tenant:
        raise Forbidden("a tenant cannot approve its own grant request")
    _usable(grant, now, "approved")
    names = caller.approver_names & set(grant.required_approvers)
    if not names:
        raise Forbidden(
            f"{caller.role} {caller.id} is not a named approver of grant {grant.id} "
            f"(needs: {', '.join(grant.required_approvers)})"
        )
    done = {a["as"] for a in grant.approvals}
    todo = names - done
    if not todo:
        raise GrantConflict(f"grant {grant.id} already carries the approval of {', '.join(sorted(names))}")
    approvals = [*grant.approvals, *({"as": n, "by": caller.id, "at": now.isoformat(), "comment": comment}
                                     for n in sorted(todo))]
    required = set(grant.required_approvers)
    approved = {a["as"] for a in approvals}
    values: dict[str, Any] = {"approvals": approvals}
    if required <= approved and decide is not None:
        again = _decide_again(session, grant, decide, now)
        if again.outcome == "deny":
            raise GrantConflict(
                f"grant {grant.id} cannot become active: the policy in force now denies it: "
                + "; ".join(again.reasons)
            )
        if again.outcome == "pending" and not set(again.approvers) <= required:
            required |= set(again.approvers)
            values["required_approvers"] = sorted(required)
    complete = required <= approved
    if complete:
        _check_quota(session, quotas, grant.src_tenant, "active", now)
        values.update(state="active", decided_at=now, expires_at=now + timedelta(seconds=grant.ttl_seconds))
    grant = _cas(session, grant, **values)
    record(
        session, actor=caller.actor, action="grant.approve", object_type="grant", object_id=grant.id,
        tenant=grant.src_tenant,
        summary={"as": sorted(todo), "state": grant.state, "approvals": len(approvals),
                 "required_approvers": list(grant.required_approvers)},
        reason=comment or None, request_id=request_id, at=now,
    )
    return grant


def reject_grant(
    session: Session, grant_id: str, *, caller: Caller, reason: str, clock: Clock = system_clock,
    request_id: str | None = None,
) -> Grant:
    now = clock()
    grant = get_grant(session, grant_id, viewer_tenant=caller.tenant)
    if caller.tenant is not None and caller.tenant == grant.src_tenant:
        raise Forbidden("a tenant cannot reject (or approve) its own grant request; revoke it instead")
    _usable(grant, now, "rejected")
    if not caller.approver_names & set(grant.required_approvers):
        raise Forbidden(
            f"{caller.role} {caller.id} is not a named approver of grant {grant.id} "
            f"(needs: {', '.join(grant.required_approvers)})"
        )
    if not reason.strip():
        raise InvalidInput("a rejection needs a reason")
    grant = _cas(session, grant, state="rejected", decided_at=now, reasons=[*grant.reasons, f"rejected: {reason}"])
    record(
        session, actor=caller.actor, action="grant.reject", object_type="grant", object_id=grant.id,
        tenant=grant.src_tenant, summary={"state": "rejected"}, reason=reason, request_id=request_id, at=now,
    )
    return grant


def revoke_grant(
    session: Session, grant_id: str, *, caller: Caller, reason: str, clock: Clock = system_clock,
    request_id: str | None = None,
) -> Grant:
    """Withdraw a pending or active grant: its source or destination tenant, security, or admin."""
    now = clock()
    grant = get_grant(session, grant_id, viewer_tenant=caller.tenant)
    state = effective_state(grant, now)
    if state not in ("pending", "active"):
        raise GrantConflict(f"grant {grant.id} is {state}; only a pending or active grant can be revoked")
    if caller.role not in ("admin", "security", "tenant-admin"):
        raise Forbidden(f"role {caller.role} may not revoke grants")
    if not reason.strip():
        raise InvalidInput("a revocation needs a reason")
    grant = _cas(session, grant, state="revoked", decided_at=now, reasons=[*grant.reasons, f"revoked: {reason}"])
    record(
        session, actor=caller.actor, action="grant.revoke", object_type="grant", object_id=grant.id,
        tenant=grant.src_tenant, summary={"state": "revoked", "was": state}, reason=reason,
        request_id=request_id, at=now,
    )
    return grant


def _state_filter(state: str, now: datetime) -> Any:
    active_now = and_(col(Grant.state) == "active", or_(col(Grant.expires_at).is_(None), col(Grant.expires_at) > now))
    pending_now = and_(
        col(Grant.state) == "pending", or_(col(Grant.pending_until).is_(None), col(Grant.pending_until) > now)
    )
    if state == "active":
        return active_now
    if state == "pending":
        return pending_now
    if state == "expired":
        return or_(
            col(Grant.state) == "expired",
            and_(col(Grant.state) == "active", col(Grant.expires_at) <= now),
            and_(col(Grant.state) == "pending", col(Grant.pending_until) <= now),
        )
    return col(Grant.state) == state


def grants_query(
    *,
    viewer_tenant: str | None,
    now: datetime,
    state: str | None = None,
    src_tenant: str | None = None,
    dst_tenant: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> Any:
    """The listing as one SELECT over the grants table (ORM entities or plain rows, as the caller runs it):
    id (time) order after the cursor; a tenant sees grants where it is source or destination."""
    query = select(Grant)
    if viewer_tenant is not None:
        query = query.where(or_(col(Grant.src_tenant) == viewer_tenant, col(Grant.dst_tenant) == viewer_tenant))
    if state is not None:
        query = query.where(_state_filter(state, now))
    if src_tenant is not None:
        query = query.where(col(Grant.src_tenant) == src_tenant)
    if dst_tenant is not None:
        query = query.where(col(Grant.dst_tenant) == dst_tenant)
    if after is not None:
        query = query.where(col(Grant.id) > after)
    return query.order_by(col(Grant.id)).limit(max(1, min(limit, MAX_PAGE + 1)))


def next_transition_query() -> Any:
    """(earliest expires_at of an active grant, earliest pending_until of a pending one): the next instant
    at which some grant's effective state changes without a write."""
    active = select(func.min(col(Grant.expires_at))).where(col(Grant.state) == "active").scalar_subquery()
    pending = select(func.min(col(Grant.pending_until))).where(col(Grant.state) == "pending").scalar_subquery()
    return select(active.label("active"), pending.label("pending"))


def list_grants(
    session: Session,
    *,
    viewer_tenant: str | None,
    now: datetime,
    state: str | None = None,
    src_tenant: str | None = None,
    dst_tenant: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> list[Grant]:
    """Grants in id (time) order after the cursor; a tenant sees those where it is source or destination."""
    query = grants_query(viewer_tenant=viewer_tenant, now=now, state=state, src_tenant=src_tenant,
                         dst_tenant=dst_tenant, after=after, limit=limit)
    return list(session.exec(query).all())


def grant_rows(
    conn: Connection, *, next_transition: bool = False, **filters: Any
) -> tuple[list[Any], datetime | None, bool]:
    """The hot listing (grants_query's `filters`) as plain rows on a read-only Core connection, no ORM:
    (rows with GrantOut's attribute names, the next instant any grant's effective state changes without a
    write (asked only with `next_transition`), whether that instant is known)."""
    rows = list(conn.execute(grants_query(**filters)).all())
    if not next_transition:
        return rows, None, False
    turn = conn.execute(next_transition_query()).first()
    if turn is None:
        return rows, None, False
    return rows, min((as_utc(t) for t in turn if t is not None), default=None), True


def _earlier_grant(session: Session, caller: Caller, key: str) -> tuple[str, tuple[str, str, str]]:
    """(the subquery of the id of the grant `caller` requested under `key`, its parameters) for the session's
    driver: the caller's own, never that of another tenant's principal with the same id."""
    return _EARLIER_GRANT[placeholder(session.connection())], (caller.requester_tenant, caller.id, key)


def find_by_idempotency_key(session: Session, caller: Caller, key: str) -> Grant | None:
    """The grant `caller` already requested under this Idempotency-Key, if any (a miss costs one indexed read on
    the driver's cursor, no ORM; prepare_request reads it with its marker instead)."""
    subquery, params = _earlier_grant(session, caller, key)
    found = driver_rows(session.connection(), f"SELECT {subquery}", params)
    return session.get(Grant, found[0][0]) if found and found[0][0] is not None else None


def sweep(session: Session, *, clock: Clock = system_clock, limit: int = 500) -> list[str]:
    """Persist expiry of grants past expires_at / pending_until; returns the ids changed."""
    now = clock()
    due = session.exec(
        select(Grant)
        .where(or_(
            and_(col(Grant.state) == "active", col(Grant.expires_at) <= now),
            and_(col(Grant.state) == "pending", col(Grant.pending_until) <= now),
        ))
        .order_by(col(Grant.id))
        .limit(limit)
        # claimed: a replica sweeping at the same time skips these rows instead of waiting to find them done
        # (PostgreSQL; SQLite's write transaction already excludes every other writer)
        .with_for_update(skip_locked=True)
    ).all()
    changed: list[str] = []
    for grant in due:
        # Each grant's compare-and-set is one Core UPDATE, with no savepoint around it and no read of the row again
        # after it (every active grant is swept once; the ORM's UPDATE, the savepoint's two statements and the
        # reload were most of the sweeper's CPU under a stream of grants): a conflict changed nothing (0 rows),
        # so there is nothing to undo, and the event needs only the id and tenant, which no update changes.
        # Any other failure fails the whole sweep, as it did.
        gid, tenant, was, version = grant.id, grant.src_tenant, grant.state, grant.version
        reason = "approval timed out" if was == "pending" else "ttl elapsed"
        result = session.execute(
            _GRANTS.update()
            .where(_GRANTS.c.id == gid, _GRANTS.c.version == version)
            .values(version=version + 1, state="expired", reasons=[*grant.reasons, f"expired: {reason}"])
        )
        session.expire(grant)  # the session's copy is stale now: read again if anyone looks
        if result.rowcount != 1:  # type: ignore[attr-defined]  # changed meanwhile: not ours to expire (kept as a guard)
            continue
        record(
            session, actor=Actor.system("grant-sweeper"), action="grant.expire", object_type="grant",
            object_id=gid, tenant=tenant, summary={"was": was, "state": "expired"}, reason=reason, at=now,
        )
        changed.append(gid)
    return changed


def encode_cursor(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        value = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("cursor is not one this API returned") from None
    if not value or len(value) > 128 or not (value.isascii() and value.isprintable()):  # ids and numbers only
        raise InvalidInput("cursor is not one this API returned")
    return value


def count_by_state(session: Session) -> dict[str, int]:
    """How many grants are in each state (every state named, zero included): for metrics."""
    from core.vocabulary import GRANT_STATES

    counts = dict.fromkeys(GRANT_STATES, 0)
    rows = session.exec(select(col(Grant.state), func.count()).group_by(col(Grant.state))).all()
    counts.update({str(state): int(n) for state, n in rows})
    return counts
