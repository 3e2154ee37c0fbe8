"""CA rotation on SPIRE's schedule.

For the active generation with lifetime L: prepare the next generation at not_before + L/2 (it is
published in the bundle at once, so peers trust it before it signs anything), activate it at
not_after - L/6. The previous generation then *retires*: it stays published (state `retiring`) until
the last SVID or JWT it signed expires, then leaves the bundle (state `retired`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlmodel import Session, select

from audit import Actor, record
from core.clock import Clock, as_utc
from keys.store import KeyStore
from pki.ca import GenerationKeys, create_generation, generation_cas, load_settings
from pki.models import CertificateAuthority, TrustDomainSettings
from pki.schedule import ALL_CAS, LIVE_STATES, activate_at, prepare_at, status_of
from pki.schedule import RotationStatus as RotationStatus


def _set_state(rows: list[CertificateAuthority], state: str, now: datetime, session: Session) -> None:
    for row in rows:
        row.state = state
        if state == "active":
            row.activated_at = now
        if state == "retired":
            row.retired_at = now
        session.add(row)


def _by_generation(session: Session) -> dict[int, list[CertificateAuthority]]:
    out: dict[int, list[CertificateAuthority]] = {}
    for ca in generation_cas(session, LIVE_STATES):
        out.setdefault(ca.generation, []).append(ca)
    return out


def _issuing(rows: list[CertificateAuthority]) -> CertificateAuthority:
    return next(r for r in rows if r.role == "issuing")


def _status(session: Session, prepared: int | None, activated: int | None, retired: list[int]) -> RotationStatus:
    cas = session.scalars(select(CertificateAuthority).from_statement(text(ALL_CAS))).all()
    return status_of(cas, prepared, activated, retired)


def ca_status(session: Session, clock: Clock) -> RotationStatus:
    """Where the CA generations stand and when the next step is due; changes nothing."""
    load_settings(session)
    return _status(session, None, None, [])


def prepare_due(session: Session, *, force: bool, now: datetime) -> bool:
    """Whether rotate(force=force) at `now` would prepare a generation, as read now without a lock (a replica may do it
    first): what tells a caller to reserve the generation's key ids first (pki.ca.reserve_generation_keys). False
    before init."""
    if session.get(TrustDomainSettings, 1) is None:
        return False
    gens = _by_generation(session)
    if any(rows[0].state == "prepared" for rows in gens.values()):
        return False
    active = next((_issuing(rows) for rows in gens.values() if rows[0].state == "active"), None)
    return force or active is None or now >= prepare_at(active)


def rotate(
    session: Session, keystore: KeyStore, *, force: bool, actor: Actor, clock: Clock, request_id: str | None = None,
    reserved: GenerationKeys | None = None,
) -> RotationStatus:
    """Run the schedule once (call it periodically); force=True prepares (if needed) and activates now. A generation
    it prepares gets the `reserved` key ids when they are its (pki.ca.create_generation)."""
    now = clock()
    settings = session.exec(
        select(TrustDomainSettings).where(TrustDomainSettings.id == 1).with_for_update()
    ).first()
    if settings is None:
        load_settings(session)  # raises NotInitialized
        raise AssertionError("unreachable")
    gens = _by_generation(session)
    active_gen = next((g for g, rows in gens.items() if rows[0].state == "active"), None)
    prepared_gen = next((g for g, rows in gens.items() if rows[0].state == "prepared"), None)
    active_issuing = _issuing(gens[active_gen]) if active_gen is not None else None
    did_prepare: int | None = None
    did_activate: int | None = None

    need_prepare = force or active_issuing is None or now >= prepare_at(active_issuing)
    if prepared_gen is None and need_prepare:
        root, issuing = create_generation(session, keystore, settings, state="prepared", now=now,
                                          reserved=reserved)
        prepared_gen = did_prepare = issuing.generation
        gens[prepared_gen] = [root, issuing]
        settings.bundle_sequence += 1
        record(session, actor=actor, action="ca.prepare", object_type="ca_generation",
               object_id=f"g{prepared_gen}", summary={
                   "generation": prepared_gen, "key_kind": issuing.key_kind, "forced": force,
                   "not_before": as_utc(issuing.not_before).isoformat(),
                   "not_after": as_utc(issuing.not_after).isoformat()}, at=now, request_id=request_id)

    need_activate = (
        force or active_issuing is None or now >= activate_at(active_issuing)
        or now >= as_utc(active_issuing.not_after)
    )
    if prepared_gen is not None and need_activate:
        if active_gen is not None:
            _set_state(gens[active_gen], "retiring", now, session)
        _set_state(gens[prepared_gen], "active", now, session)
        did_activate = prepared_gen
        record(session, actor=actor, action="ca.activate", object_type="ca_generation",
               object_id=f"g{prepared_gen}", summary={
                   "generation": prepared_gen, "previous": active_gen, "forced": force}, at=now, request_id=request_id)

    retired: list[int] = []
    for gen, rows in sorted(gens.items()):
        if rows[0].state != "retiring":
            continue
        issuing = _issuing(rows)
        last = as_utc(issuing.signed_until) if issuing.signed_until else None
        if last is None or last <= now or as_utc(issuing.not_after) <= now:
            _set_state(rows, "retired", now, session)
            retired.append(gen)
            settings.bundle_sequence += 1
            record(session, actor=actor, action="ca.retire", object_type="ca_generation",
                   object_id=f"g{gen}", summary={
                       "generation": gen, "signed_until": last.isoformat() if last else None},
                   at=now, request_id=request_id)
    session.add(settings)
    session.flush()
    return _status(session, did_prepare, did_activate, retired)
