"""The data document the Rego policies read, built from the inventory and the grants.

Shape (all under `data.tf`; see rego/flows.rego):
  tenants[t]  = {"quarantined", "groups": {g: {"labels", "exposed": {proto: [sorted ports]}, "sensitivity",
                 "quarantined"}}}
  grants[src_tenant][dst_tenant][grant_id] = {"src_group", "dst_group", "proto", "ports", "expires_at_ns"}
  revoked[spiffe_id] = true   (a workload's identity: Workload.revoked, or revoked through pki)
  tenants[t]["revoked"] / tenants[t]["groups"][g]["revoked"] = true when every identity of the tenant /
  group was revoked through pki (absent otherwise)

There is no `now` in it, so rebuilding it at another instant changes nothing unless the inventory or the
grants did (and an engine reloads incrementally). Expiry is checked again at decision time against
input.now_ns (explain, impact) or the engine's clock.

Only grants that are active AND unexpired at `now` are in it: a grant whose expires_at <= now is never
active, whatever its state column says; an active grant without expires_at is left out (fail closed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from sqlmodel import Session

from audit.models import HEAD_ID, AuditHead
from core.clock import as_utc
from core.errors import InvalidInput
from inventory.models import Tenant, Workload, WorkloadGroup
from pki.models import RevokedIdentity
from policy.models import Grant, PolicyDataVersion, PolicyVersion
from store.carried import CarriedCheck
from store.db import driver_rows, placeholder

log = logging.getLogger(__name__)

DATA_KEY = "tf"
PROTOS = ("tcp", "udp")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ns(when: datetime) -> int:
    """Nanoseconds since the epoch; a naive value is a database read (SQLite keeps UTC without an offset)."""
    return ((as_utc(when) - _EPOCH) // timedelta(microseconds=1)) * 1000


def exposed_ports(ports: list[dict[str, Any]]) -> dict[str, list[int]]:
    """{"tcp": [443, 8443]} from [{"proto": "tcp", "port": 443}, ...]; malformed entries are skipped."""
    out: dict[str, set[int]] = {}
    for entry in ports:
        proto = entry.get("proto") if isinstance(entry, dict) else None
        port = entry.get("port") if isinstance(entry, dict) else None
        if proto not in PROTOS or not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            log.warning("ignoring malformed exposed port %r", entry)
            continue
        out.setdefault(str(proto), set()).add(port)
    return {proto: sorted(ps) for proto, ps in sorted(out.items())}


class GroupFields(Protocol):
    """What group_entry reads: a WorkloadGroup, or a row of those columns (build_data)."""

    @property
    def labels(self) -> dict[str, str] | None: ...
    @property
    def ports(self) -> list[dict[str, Any]] | None: ...
    @property
    def sensitivity(self) -> str: ...
    @property
    def quarantined(self) -> bool: ...


class GrantFields(Protocol):
    """What grant_is_live and grant_entry read: a Grant, or a row of those columns (build_data)."""

    @property
    def src_group(self) -> str: ...
    @property
    def dst_group(self) -> str: ...
    @property
    def proto(self) -> str: ...
    @property
    def ports(self) -> list[int]: ...
    @property
    def state(self) -> str: ...
    @property
    def expires_at(self) -> datetime | None: ...


def group_entry(group: GroupFields) -> dict[str, Any]:
    return {
        "labels": dict(group.labels or {}),
        "exposed": exposed_ports(list(group.ports or [])),
        "sensitivity": group.sensitivity,
        "quarantined": bool(group.quarantined),
    }


def grant_is_live(grant: GrantFields, now: datetime) -> bool:
    """Active and unexpired at `now` (expires_at is authoritative over the state column)."""
    if grant.state != "active" or grant.expires_at is None:
        return False
    return as_utc(grant.expires_at) > as_utc(now)


def grant_entry(grant: GrantFields) -> dict[str, Any]:
    assert grant.expires_at is not None
    return {
        "src_group": grant.src_group,
        "dst_group": grant.dst_group,
        "proto": grant.proto,
        "ports": sorted({int(p) for p in grant.ports}),
        "expires_at_ns": to_ns(grant.expires_at),
    }


def build_data(session: Session, now: datetime) -> dict[str, Any]:
    """The whole data document at `now` (timezone-aware); read-only on the session.

    Reads only the columns the document holds, in plain SQL on the driver's cursor (store.db.driver_rows), no ORM:
    with a stream of active grants every change of the policy data makes each replica's next decision build this
    again, and loading whole Grant rows as ORM instances (18 columns, four of them JSON) through SQLAlchemy's
    statement execution was the largest part of that build. Pending changes are flushed first, as the autoflush of
    the ORM's queries did, and nothing is added to the session."""
    if now.tzinfo is None:
        raise InvalidInput("build_data needs a timezone-aware `now`")
    session.flush()
    conn = session.connection()
    tenants: dict[str, Any] = {}
    for slug, quarantined in driver_rows(conn, _TENANTS, ()):
        tenants[slug] = {"quarantined": bool(quarantined), "groups": {}}
    for tenant, name, labels, ports, sensitivity, quarantined in driver_rows(conn, _GROUPS, ()):
        if tenant in tenants:
            tenants[tenant]["groups"][name] = group_entry(
                _GroupRow(_json(labels), _json(ports), sensitivity, bool(quarantined)))
    revoked = {spiffe_id: True for (spiffe_id,) in driver_rows(conn, _REVOKED_WORKLOADS, ())}
    for prefix, tenant, group, workload in driver_rows(conn, _REVOKED_IDENTITIES, ()):
        # pki's identity revocations (POST /v1/svids/revoke by tenant / group / workload) withdraw flows too
        if workload is not None:
            revoked[prefix] = True
            continue
        tenant_entry = tenants.get(tenant)
        if tenant_entry is None:
            continue
        if group is None:
            tenant_entry["revoked"] = True
        elif group in tenant_entry["groups"]:
            tenant_entry["groups"][group]["revoked"] = True
    revoked = dict(sorted(revoked.items()))
    grants: dict[str, dict[str, dict[str, Any]]] = {}
    for gid, src_tenant, dst_tenant, src_group, dst_group, proto, ports, state, expires_at in driver_rows(
        conn, _ACTIVE_GRANTS, ()
    ):
        grant = _GrantRow(src_group, dst_group, proto, _json(ports), state, _when(expires_at))
        if grant_is_live(grant, now):
            grants.setdefault(src_tenant, {}).setdefault(dst_tenant, {})[gid] = grant_entry(grant)
    return {DATA_KEY: {"tenants": tenants, "grants": grants, "revoked": revoked}}


# build_data's statements: the same SQL on both databases, no parameters (what SQLAlchemy compiled for the ORM
# queries they replace, less the columns the document does not hold; tests/policy/test_data.py compares the two)
_TENANTS = "SELECT slug, quarantined FROM tenants ORDER BY slug"
_GROUPS = ("SELECT tenant, name, labels, ports, sensitivity, quarantined FROM workload_groups "
           "ORDER BY tenant, name")
_REVOKED_WORKLOADS = "SELECT spiffe_id FROM workloads WHERE revoked IS true ORDER BY spiffe_id"
_REVOKED_IDENTITIES = 'SELECT spiffe_id_prefix, tenant, "group", workload FROM pki_revoked_identities ORDER BY id'
_ACTIVE_GRANTS = ("SELECT id, src_tenant, dst_tenant, src_group, dst_group, proto, ports, state, expires_at "
                  "FROM grants WHERE state = 'active' ORDER BY id")
assert Tenant.__tablename__ == "tenants" and WorkloadGroup.__tablename__ == "workload_groups"
assert Workload.__tablename__ == "workloads" and RevokedIdentity.__tablename__ == "pki_revoked_identities"
assert Grant.__tablename__ == "grants"


class _GroupRow(NamedTuple):
    labels: dict[str, str] | None
    ports: list[dict[str, Any]] | None
    sensitivity: str
    quarantined: bool


class _GrantRow(NamedTuple):
    src_group: str
    dst_group: str
    proto: str
    ports: list[int]
    state: str
    expires_at: datetime | None


def _json(value: Any) -> Any:
    """A JSON column's value from the driver: PostgreSQL's driver decodes it, SQLite's hands back the text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _when(value: Any) -> datetime | None:
    """A timestamp column's value from the driver: PostgreSQL's an aware datetime, SQLite's the text SQLAlchemy
    stored (UTC, no offset; as_utc reads a naive value as UTC)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def data_fingerprint(session: Session) -> tuple[Any, ...] | None:
    """A value that changes whenever a row build_data reads changes, as this session's transaction sees it
    (pending changes flushed first): the policy data version, which database triggers bump in every
    transaction that inserts, updates or deletes such a row (policy/migrations.py step 9; keep its column
    lists in step with build_data). Two documents built at the same `now` under equal fingerprints are
    equal. One indexed read of one row; None when the row is missing (a database not migrated)."""
    row = _data_version_row(session)
    return None if row is None else (int(row[0]),)


def fingerprint_and_active(session: Session) -> tuple[tuple[Any, ...], str | None] | None:
    """(data_fingerprint(session), the active policy version's content hash or None) in one statement: all a
    kept engine checks before each decision (policy/grant_decider.py). None when the data version row is
    missing (a database not migrated)."""
    row = session.info.pop(_READ_WITH_MARKER, None)
    if row is None:
        row = _data_version_row(session, _FINGERPRINT_AND_ACTIVE)
    return None if row is None else ((int(row[0]),), None if row[1] is None else str(row[1]))


_READ_WITH_MARKER = "tf_decision_state"


def marker_for_decision(session: Session, also: tuple[str, tuple[Any, ...]] | None = None,
                        carried: Sequence[CarriedCheck] = ()) -> tuple[int, Any]:
    """The audit log's size, read in one statement with what the grant decider reads first (fingerprint_and_active,
    which then takes that row from the session instead of reading it again): a decision made in a transaction
    per statement (store.db's `statement` or PostgreSQL's autocommit) pays one round trip for both, and the
    marker is still read no later than anything the decision reads. Call `forget_decision_state` once the
    decision is made, so an unused row is never taken by a later decision in the same session. `also`: a scalar
    subquery in the driver's SQL and its parameters, read in the same statement (the caller's own first read, a
    round trip fewer), whose value comes back beside the size. `carried`: checks (store/carried.py, on PostgreSQL)
    read in the same statement and settled with their values before anything else is done with it (each raises what
    it refuses with); elsewhere each is made on its own first."""
    if carried and placeholder(session.connection()) != "%s":
        for check in carried:
            check.make()
        carried = ()
    query, params = _MARKER_FINGERPRINT_AND_ACTIVE, ()
    if also is not None or carried:
        extra = [] if also is None else [also]
        extra += [check.subquery() for check in carried]
        query = f"{_MARKER_COLUMNS}, {', '.join(sql for sql, _p in extra)}{_MARKER_FROM}"
        params = tuple(p for _sql, values in extra for p in values)
    row = _data_version_row(session, query, params)
    if row is None:  # a database without the data version row: nothing kept, the size alone (and `also` alone)
        from audit.service import tree_size

        for check in carried:
            check.make()
        size = tree_size(session)
        if also is None:
            return size, None
        rows = driver_rows(session.connection(), f"SELECT {also[0]}", also[1])
        return size, rows[0][0] if rows else None
    first = 4 if also is not None else 3
    for i, check in enumerate(carried):  # before the row is kept or anything read is used
        check.settle(row[first + i])
    session.info[_READ_WITH_MARKER] = row
    return int(row[2] or 0), row[3] if also is not None else None


def forget_decision_state(session: Session) -> None:
    session.info.pop(_READ_WITH_MARKER, None)


# Plain SQL, the same on both databases (no parameters), sent on the driver's cursor (store.db.driver_rows): the
# ORM's statement execution cost a decision ~4 times the driver's CPU for these one-row reads.
_DATA_VERSION = "SELECT n FROM policy_data_version WHERE id = 1"
_FINGERPRINT_AND_ACTIVE = (
    "SELECT n, (SELECT content_hash FROM policy_versions WHERE state = 'active') FROM policy_data_version WHERE id = 1")
_MARKER_COLUMNS = ("SELECT n, (SELECT content_hash FROM policy_versions WHERE state = 'active'), "
                   "(SELECT size FROM audit_head WHERE id = 1)")
_MARKER_FROM = " FROM policy_data_version WHERE id = 1"
_MARKER_FINGERPRINT_AND_ACTIVE = _MARKER_COLUMNS + _MARKER_FROM
assert PolicyDataVersion.__tablename__ == "policy_data_version" and PolicyVersion.__tablename__ == "policy_versions"
assert AuditHead.__tablename__ == "audit_head" and HEAD_ID == 1


# The data version's row, locked as the triggers' UPDATE locks it (FOR NO KEY UPDATE: n is no key), or no row when
# another transaction holds it: SKIP LOCKED never waits. (This transaction's own lock is no reason to skip it.)
_TAKE_DATA_VERSION = "SELECT id FROM policy_data_version WHERE id = 1 FOR NO KEY UPDATE SKIP LOCKED"


def take_data_version_now(session: Session) -> bool:
    """Lock the policy data version's row for the rest of the transaction if that needs no wait: whether the
    transaction holds it now (another's lock: False, at once). For a writer holding the audit head's lock, which may
    not wait for a row (store/groupcommit.py: late members). SQLite: True, its writer lock is this transaction's
    since BEGIN IMMEDIATE, so no other transaction holds any row."""
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        return True
    return bool(driver_rows(conn, _TAKE_DATA_VERSION, ()))


def _data_version_row(session: Session, query: str = _DATA_VERSION, params: tuple[Any, ...] = ()) -> Any:
    session.flush()  # as the autoflush of build_data's queries would
    rows = driver_rows(session.connection(), query, params)
    return rows[0] if rows else None


def live_until(data: Mapping[str, Any]) -> int | None:
    """The earliest expires_at_ns of a grant in a document from build_data: until then, the document
    built at an earlier `now` is the one build_data would build (None: no grant in it can expire)."""
    out: int | None = None
    for by_dst in data.get(DATA_KEY, {}).get("grants", {}).values():
        for by_id in by_dst.values():
            for entry in by_id.values():
                ns = int(entry["expires_at_ns"])
                out = ns if out is None else min(out, ns)
    return out


def grant_ops(current: Mapping[str, Any], grant: Grant, now: datetime) -> list[dict[str, Any]]:
    """The patch that brings `current` (a document from build_data) up to date for one grant: add or
    replace it when it is live at `now`, remove it otherwise. For callers that know which grant changed
    (the grants service): cheaper than rebuilding and diffing the whole document."""
    path = f"/{DATA_KEY}/grants/{_esc(grant.src_tenant)}/{_esc(grant.dst_tenant)}/{_esc(grant.id)}"
    by_id = current.get(DATA_KEY, {}).get("grants", {}).get(grant.src_tenant, {}).get(grant.dst_tenant, {})
    present = grant.id in by_id
    if grant_is_live(grant, now):
        entry = grant_entry(grant)
        if present and by_id[grant.id] == entry:
            return []
        return [{"op": "replace" if present else "add", "path": path, "value": entry}]
    if not present:
        return []
    # prune emptied parents, so the document stays equal to a rebuild
    by_dst = current[DATA_KEY]["grants"][grant.src_tenant]
    if len(by_id) > 1:
        return [{"op": "remove", "path": path}]
    if len(by_dst) > 1:
        return [{"op": "remove", "path": path.rsplit("/", 1)[0]}]
    return [{"op": "remove", "path": path.rsplit("/", 2)[0]}]


def _esc(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")
