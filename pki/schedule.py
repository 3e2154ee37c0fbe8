"""Where the CA generations stand and when the next rotation step is due, computed from the CA rows alone
(no database code): rotation (pki/rotation.py) runs it on ORM rows, the CLI's read-only `ca status` on rows
read through sqlite3 (store/readonly.py), both selected by the one SQL text below."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from core.clock import as_utc
from pki.errors import NotInitialized

if TYPE_CHECKING:
    from pki.models import CertificateAuthority
    from store.readonly import ReadOnlyDb, Record

    CARow: TypeAlias = CertificateAuthority | Record  # an ORM row, or one read through sqlite3

CAS_TABLE = "pki_cas"  # pki.models.CertificateAuthority.__tablename__ (tests/cli/test_read_path.py checks)
SETTINGS_TABLE = "pki_settings"  # pki.models.TrustDomainSettings.__tablename__
ALL_CAS = f"SELECT * FROM {CAS_TABLE}"  # noqa: S608 (constants, no input)
SETTINGS = f"SELECT * FROM {SETTINGS_TABLE} WHERE id = 1"  # noqa: S608
NOT_INITIALIZED = "the trust domain is not initialised: run `trustfabric init --trust-domain <td>`"
LIVE_STATES = ("prepared", "active", "retiring")  # the generations the schedule acts on


@dataclass(frozen=True)
class CAInfo:
    id: str
    generation: int
    role: str
    state: str
    key_kind: str
    not_before: datetime
    not_after: datetime
    signed_until: datetime | None


@dataclass(frozen=True)
class RotationStatus:
    """What rotate() did (prepared/activated/retired generation numbers) and where things stand."""

    prepared: int | None
    activated: int | None
    retired: list[int]
    active_generation: int | None
    next_prepare_at: datetime | None
    next_activate_at: datetime | None
    cas: list[CAInfo]


def prepare_at(ca: CARow) -> datetime:
    nb, na = as_utc(ca.not_before), as_utc(ca.not_after)
    return nb + (na - nb) / 2


def activate_at(ca: CARow) -> datetime:
    nb, na = as_utc(ca.not_before), as_utc(ca.not_after)
    return na - (na - nb) / 6


def status_of(cas: Iterable[CARow], prepared: int | None = None, activated: int | None = None,
              retired: list[int] | None = None) -> RotationStatus:
    """The status over every CA row (ALL_CAS), with what a rotation run just did."""
    rows = list(cas)
    gens: dict[int, list[CARow]] = {}
    live = sorted((c for c in rows if c.state in LIVE_STATES), key=lambda c: (c.generation, c.role != "root"))
    for ca in live:
        gens.setdefault(ca.generation, []).append(ca)
    active = next((g for g, members in gens.items() if members[0].state == "active"), None)
    nxt_prepare = nxt_activate = None
    if active is not None:
        issuing = next(r for r in gens[active] if r.role == "issuing")
        nxt_activate = activate_at(issuing)
        if not any(members[0].state == "prepared" for members in gens.values()):
            nxt_prepare = prepare_at(issuing)
    infos = [
        CAInfo(id=ca.id, generation=ca.generation, role=ca.role, state=ca.state, key_kind=ca.key_kind,
               not_before=as_utc(ca.not_before), not_after=as_utc(ca.not_after),
               signed_until=as_utc(ca.signed_until) if ca.signed_until else None)
        for ca in rows
    ]
    infos.sort(key=lambda c: (c.generation, c.role != "root"))
    return RotationStatus(prepared=prepared, activated=activated, retired=list(retired or []),
                          active_generation=active, next_prepare_at=nxt_prepare, next_activate_at=nxt_activate,
                          cas=infos)


def ca_status(db: ReadOnlyDb) -> RotationStatus:
    """pki.service.ca_status over the CLI's read-only database; NotInitialized before `init`."""
    if not db.rows(SETTINGS, SETTINGS_TABLE):
        raise NotInitialized(NOT_INITIALIZED)
    return status_of(db.rows(ALL_CAS, CAS_TABLE))


def status_dict(status: RotationStatus) -> dict[str, Any]:
    """RotationStatus as JSON-friendly data (the API and the CLI show the same)."""
    def ts(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "prepared": status.prepared, "activated": status.activated, "retired": status.retired,
        "active_generation": status.active_generation, "next_prepare_at": ts(status.next_prepare_at),
        "next_activate_at": ts(status.next_activate_at),
        "cas": [{"id": c.id, "generation": c.generation, "role": c.role, "state": c.state, "key_kind": c.key_kind,
                 "not_before": ts(c.not_before), "not_after": ts(c.not_after), "signed_until": ts(c.signed_until)}
                for c in status.cas],
    }
