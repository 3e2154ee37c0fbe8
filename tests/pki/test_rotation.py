"""CA rotation on SPIRE's schedule, driven by a frozen clock: SVIDs from before and after rotation verify
against the published bundle; once the old generation retires, its SVIDs no longer do."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from cryptography.x509.verification import VerificationError
from spiffe import JwtBundle, JwtSvid, TrustDomain

from core.clock import FrozenClock
from keys.file import FileKeyStore
from pki import service
from store.db import Database
from tests.pki.helpers import ADMIN, TD, actions, make_csr, verify_chain


def _issue(db: Database, ks: FileKeyStore, clock: FrozenClock) -> service.IssuedX509:
    with db.session() as s:
        return service.issue_x509_svid(s, ks, csr_pem=make_csr(), tenant="acme", group="web", workload="frontend",
                                       ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)


def _rotate(db: Database, ks: FileKeyStore, clock: FrozenClock, force: bool = False) -> service.RotationStatus:
    with db.session() as s:
        return service.rotate(s, ks, force=force, actor=ADMIN, clock=clock)


def _bundle(db: Database) -> tuple[bytes, dict[str, object]]:
    with db.read_session() as s:
        return service.bundle_pem(s), service.bundle_jwks(s)


def _verifies(issued: service.IssuedX509, roots: bytes, at: datetime) -> bool:
    try:
        verify_chain(issued.cert_pem, issued.chain_pem, roots, at)
    except VerificationError:
        return False
    return True


def test_schedule_prepare_activate_retire(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    with pki_db.read_session() as s:
        status = service.ca_status(s, clock)
    assert status.active_generation == 1
    assert status.next_prepare_at is not None and status.next_activate_at is not None
    life = timedelta(days=7, seconds=10)
    assert status.next_prepare_at - clock() == pytest.approx(life / 2 - timedelta(seconds=10), abs=timedelta(seconds=1))

    # before half life: nothing happens, nothing is recorded
    clock.advance(timedelta(days=1))
    n_events = len(actions(pki_db))
    st = _rotate(pki_db, keystore, clock)
    assert (st.prepared, st.activated, st.retired) == (None, None, [])
    assert len(actions(pki_db)) == n_events

    # half life: g2 is prepared and published at once, g1 still signs
    clock.now = status.next_prepare_at
    st = _rotate(pki_db, keystore, clock)
    assert st.prepared == 2 and st.activated is None and st.active_generation == 1
    roots_pem, doc = _bundle(pki_db)
    assert roots_pem.count(b"BEGIN CERTIFICATE") == 2 and doc["spiffe_sequence"] == 2
    old = _issue(pki_db, keystore, clock)
    assert old.issuer_ca_id == "g1-issuing"

    # 1/6 before expiry: g2 activates, g1 keeps being published while its SVID lives
    clock.now = status.next_activate_at - timedelta(minutes=30)
    old = _issue(pki_db, keystore, clock)  # expires 30 min after activation
    clock.now = status.next_activate_at
    st = _rotate(pki_db, keystore, clock)
    assert st.activated == 2 and st.active_generation == 2 and st.retired == []
    new = _issue(pki_db, keystore, clock)
    assert new.issuer_ca_id == "g2-issuing"
    roots_pem, _ = _bundle(pki_db)
    assert _verifies(old, roots_pem, clock()) and _verifies(new, roots_pem, clock())

    # the old SVID expired: g1 retires and leaves the bundle; its SVIDs no longer verify against it,
    # even at a time when the certificate itself was still valid
    clock.advance(timedelta(minutes=31))
    st = _rotate(pki_db, keystore, clock)
    assert st.retired == [1]
    retired_roots, doc = _bundle(pki_db)
    assert retired_roots.count(b"BEGIN CERTIFICATE") == 1 and doc["spiffe_sequence"] == 3
    issued_at = old.expires_at - timedelta(minutes=5)
    assert _verifies(old, roots_pem, issued_at)  # the bundle before retirement accepted it
    assert not _verifies(old, retired_roots, issued_at)
    assert _verifies(new, retired_roots, clock())
    assert actions(pki_db)[-1] == "ca.retire"
    assert [a for a in actions(pki_db) if a.startswith("ca.")] == ["ca.init", "ca.prepare", "ca.activate", "ca.retire"]


def test_forced_rotation_keeps_old_svids_and_jwts_valid_until_they_expire(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    old = _issue(pki_db, keystore, clock)
    with pki_db.session() as s:
        old_jwt = service.issue_jwt_svid(s, keystore, tenant="acme", group="web", workload="frontend",
                                         audience=["a"], ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)
    st = _rotate(pki_db, keystore, clock, force=True)
    assert (st.prepared, st.activated) == (2, 2)
    new = _issue(pki_db, keystore, clock)
    roots, doc = _bundle(pki_db)
    assert _verifies(old, roots, clock()) and _verifies(new, roots, clock())
    jwt_keys = [k for k in doc["keys"] if k["use"] == "jwt-svid"]  # type: ignore[attr-defined]
    assert len(jwt_keys) == 2
    bundle = JwtBundle.parse(TrustDomain(TD), json.dumps({"keys": jwt_keys}).encode())
    JwtSvid.parse_and_validate(old_jwt.token, bundle, {"a"})
    assert actions(pki_db)[-3:] == ["ca.prepare", "ca.activate", "svid.issue"]
    # after the old SVID's expiry (1 h; the JWT's 5 min) the old generation retires
    clock.advance(timedelta(hours=1, seconds=1))
    assert _rotate(pki_db, keystore, clock).retired == [1]


def test_rotation_needs_init(db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    from pki.errors import NotInitialized

    with pytest.raises(NotInitialized), db.session() as s:
        service.rotate(s, keystore, force=True, actor=ADMIN, clock=clock)
