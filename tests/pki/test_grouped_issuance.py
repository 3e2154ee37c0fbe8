"""Group-committed X.509-SVID issuance (pki.service.issue_x509_svid_grouped) on both databases: the same SVID
and audit event as the one-transaction path; and what changes between the signature and the commit wins:
an identity revoked meanwhile gets nothing (nothing written), a CA rotated meanwhile re-signs with the new
active CA. The changes are real transactions committed in that gap."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from sqlalchemy import event as sqlalchemy_event
from sqlmodel import Session, select

from audit import record
from audit.service import lock_head
from core.clock import FrozenClock, as_utc
from keys.file import FileKeyStore
from pki import registrations, service
from pki.ca import active_issuing, publish_until
from pki.errors import IdentityRevoked
from pki.models import CertificateAuthority, IssuedSvid
from pki.spiffe_id import SpiffeId
from store.db import Database
from store.groupcommit import GroupCommitter, RowLock
from tests.pki.helpers import ADMIN, TD, actions, counts, make_csr, register


class _Between(GroupCommitter):
    """A committer that commits `change` in its own transaction after the certificate was signed and before
    the SVID is recorded (once)."""

    def __init__(self, db: Database, change: Callable[[], None]) -> None:
        super().__init__(db)
        self._change: Callable[[], None] | None = change

    def submit(self, fn: Callable[[Session], Any], check: Any = None, *, savepoint: bool = True,
               late: bool | RowLock = False) -> Any:
        if self._change is not None:
            change, self._change = self._change, None
            change()
        return super().submit(fn, check, savepoint=savepoint, late=late)


def _issue(db: Database, committer: GroupCommitter, ks: FileKeyStore, clock: FrozenClock) -> service.IssuedX509:
    return service.issue_x509_svid_grouped(db, committer, ks, csr_pem=make_csr(), tenant="acme", group="web",
                                           workload="frontend", ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)


def test_grouped_issuance_records_the_svid_and_its_event(pki_db: Database, keystore: FileKeyStore,
                                                         clock: FrozenClock) -> None:
    committer = GroupCommitter(pki_db)
    before = counts(pki_db)
    issued = _issue(pki_db, committer, keystore, clock)
    committer.close()
    assert counts(pki_db) == (before[0] + 1, before[1] + 1)
    assert actions(pki_db)[-1] == "svid.issue" and issued.spiffe_id.endswith("/acme/group/web/frontend")


def test_an_identity_revoked_between_signing_and_recording_gets_nothing(pki_db: Database, keystore: FileKeyStore,
                                                                        clock: FrozenClock) -> None:
    def revoke() -> None:
        with pki_db.session() as s:
            service.revoke(s, tenant="acme", group="web", workload="frontend", reason="compromised", actor=ADMIN,
                           scope_tenant=None, clock=clock)

    committer = _Between(pki_db, revoke)
    before = counts(pki_db)
    with pytest.raises(IdentityRevoked):
        _issue(pki_db, committer, keystore, clock)
    committer.close()
    assert counts(pki_db) == (before[0], before[1] + 1)  # only the revocation's event: no SVID row, no issue event


def test_a_rotation_between_signing_and_recording_signs_again_with_the_new_ca(
        pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    committer = GroupCommitter(pki_db)
    first = _issue(pki_db, committer, keystore, clock)  # the process now remembers the active CA

    def rotate() -> None:
        for _ in range(2):  # prepare, then activate
            with pki_db.session() as s:
                service.rotate(s, keystore, force=True, actor=ADMIN, clock=clock)

    between = _Between(pki_db, rotate)
    second = _issue(pki_db, between, keystore, clock)
    committer.close()
    between.close()
    with pki_db.read_session() as s:
        active = service.ca_status(s, clock)
    assert second.issuer_ca_id != first.issuer_ca_id
    assert second.issuer_ca_id in str(active)


def test_a_cached_registration_is_read_again_once_the_log_shows_a_change(
        pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    """The committing check's reads are kept per process (pki/registrations.py) while only issuances were
    appended; a quarantine committed elsewhere (its audit event) empties the cache, and the next issuance is
    refused, then lifting it issues again."""
    from inventory.errors import Quarantined
    from inventory.service import set_quarantine

    committer = GroupCommitter(pki_db)
    _issue(pki_db, committer, keystore, clock)
    cleared = registrations.cleared(pki_db)
    _issue(pki_db, committer, keystore, clock)  # only svid.issue since: served from the cache
    assert registrations.cleared(pki_db) == cleared
    before = counts(pki_db)
    with pki_db.session() as s:
        set_quarantine(s, tenant="acme", group="web", quarantined=True, reason="incident", actor=ADMIN)
    with pytest.raises(Quarantined):
        _issue(pki_db, committer, keystore, clock)
    assert counts(pki_db) == (before[0], before[1] + 1)  # the quarantine's event only
    assert registrations.cleared(pki_db) == cleared + 1
    with pki_db.session() as s:
        set_quarantine(s, tenant="acme", group="web", quarantined=False, reason="fixed", actor=ADMIN)
    _issue(pki_db, committer, keystore, clock)
    committer.close()


def _registered(n: int) -> registrations.Registered:
    return registrations.Registered(SpiffeId(TD, f"w{n}"), 3600, 86400)


def test_a_marker_moved_by_a_rolled_back_transaction_is_not_trusted(pki_db: Database) -> None:
    """A batch validated the cache at a head that included its own (uncommitted) event, then rolled back; the
    number of that event went to a registration change committed elsewhere. Same size, another leaf hash: the
    next batch empties the cache and reads the registration again. And a read made in the rolled-back
    transaction is not kept."""
    reads: list[str] = []

    def read(key: str, n: int) -> Callable[[], registrations.Registered]:
        def reader() -> registrations.Registered:
            reads.append(key)
            return _registered(n)
        return reader

    with pki_db.session() as s:
        registrations.lookup(pki_db, s, "a", read("a", 1))
    with pki_db.session() as s:
        assert registrations.lookup(pki_db, s, "a", read("a", 9)) == _registered(1)  # kept
    with pytest.raises(RuntimeError), pki_db.session() as s:
        record(s, actor=ADMIN, action="svid.issue", object_type="svid", object_id="1")
        registrations.lookup(pki_db, s, "b", read("b", 2))  # validated with the uncommitted event
        raise RuntimeError("rolled back")
    with pki_db.session() as s:  # that number, now a registration change
        record(s, actor=ADMIN, action="workload.revoke", object_type="workload", object_id="acme/web/frontend")
    with pki_db.session() as s:
        assert registrations.lookup(pki_db, s, "a", read("a", 3)) == _registered(3)
        assert registrations.lookup(pki_db, s, "b", read("b", 4)) == _registered(4)
    with pki_db.session() as s:
        assert registrations.lookup(pki_db, s, "a", read("a", 5)) == _registered(3)  # nothing since: kept
    assert reads == ["a", "b", "a", "b"]


def test_a_read_is_kept_only_when_the_outermost_transaction_commits(pki_db: Database) -> None:
    """SQLAlchemy fires `after_commit` when a savepoint is released too. A read made after an uncommitted
    change (here: the reader returns what the transaction itself wrote) must not join the cache at a savepoint's
    release: the outer transaction may still roll back, and nothing would invalidate the read (no event of it
    is ever committed)."""
    with pytest.raises(RuntimeError), pki_db.session() as s:
        registrations.lookup(pki_db, s, "a", lambda: _registered(1))  # validated: the head is locked
        with s.begin_nested():
            registrations.lookup(pki_db, s, "b", lambda: _registered(2))  # an uncommitted registration
        raise RuntimeError("rolled back")
    with pki_db.session() as s:
        assert registrations.lookup(pki_db, s, "a", lambda: _registered(3)) == _registered(3)
        assert registrations.lookup(pki_db, s, "b", lambda: _registered(4)) == _registered(4)
    with pki_db.session() as s:  # and what a committed transaction read across a savepoint is kept
        with s.begin_nested():
            registrations.lookup(pki_db, s, "c", lambda: _registered(5))
        registrations.lookup(pki_db, s, "d", lambda: _registered(6))
    with pki_db.session() as s:
        assert registrations.lookup(pki_db, s, "c", lambda: _registered(7)) == _registered(5)
        assert registrations.lookup(pki_db, s, "d", lambda: _registered(8)) == _registered(6)


@pytest.mark.postgres
def test_an_issuance_batch_never_waits_for_the_ca_row_while_holding_the_audit_head(
        postgres_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    """A JWT-SVID, a node's certificate or a rotation locks the CA row, then appends its event (the audit head's
    lock). A group-committed issuance that wrote its CA's signed_until in its batch did so under the head, waiting
    for that row while the other waited for the head: a deadlock PostgreSQL broke after deadlock_timeout, every
    writer stalled meanwhile. The issuance raises signed_until before its batch instead. Deadlock detection is put
    off here (30 s), so such a wait would hang: both must finish, and the SVID's CA stays published past it."""
    db = postgres_db
    with db.session() as s:
        assert service.init_trust_domain(s, keystore, trust_domain=TD, clock=clock)
        register(s, "acme", "web", "frontend")
        s.connection().exec_driver_sql(f'ALTER DATABASE "{db.engine.url.database}" SET deadlock_timeout = \'30s\'')
    db.engine.dispose()  # new connections take it
    committer = GroupCommitter(db, head_lock=lock_head)
    _issue(db, committer, keystore, clock)  # the process now knows the CA and its signed_until
    clock.advance(timedelta(seconds=5))  # the next SVID expires later: its CA's signed_until must move
    ca_locked, done = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def jwt_like() -> None:  # as issue_jwt_svid: the CA row first, the head at its append
        try:
            with db.session() as s:
                ca = active_issuing(s, clock())
                ca_locked.set()
                deadline = time.monotonic() + 10
                while not _someone_waits_for_a_lock(db) and time.monotonic() < deadline:
                    time.sleep(0.01)  # bounded: the issuance is about to wait for the CA row
                record(s, actor=ADMIN, action="svid.jwt.issue", object_type="jwt_svid", object_id=ca.id, at=clock())
            outcomes["jwt"] = "committed"
        except Exception as exc:
            outcomes["jwt"] = exc

    def issuance() -> None:
        try:
            outcomes["svid"] = _issue(db, committer, keystore, clock)
        except Exception as exc:
            outcomes["svid"] = exc
        finally:
            done.set()

    rival = threading.Thread(target=jwt_like)
    rival.start()
    assert ca_locked.wait(timeout=30)
    issuer = threading.Thread(target=issuance)
    issuer.start()
    finished = done.wait(timeout=20)
    rival.join(timeout=40)
    issuer.join(timeout=40)
    committer.close()
    assert finished, "the issuance hung: a deadlock between the CA row and the audit head"
    svid = outcomes["svid"]
    assert outcomes["jwt"] == "committed" and isinstance(svid, service.IssuedX509)
    with db.read_session() as s:
        ca = s.get(CertificateAuthority, svid.issuer_ca_id)
        assert ca is not None and ca.signed_until is not None and as_utc(ca.signed_until) >= svid.expires_at


def _someone_waits_for_a_lock(db: Database) -> bool:
    with db.read_session() as s:
        return bool(s.connection().exec_driver_sql("SELECT count(*) > 0 FROM pg_locks WHERE NOT granted").scalar())


def test_concurrent_issuances_of_one_second_raise_their_cas_signed_until_once(pki_db: Database,
                                                                               clock: FrozenClock) -> None:
    """Every requester of a second needs the same signed_until: one raises it (one UPDATE, committed), the others
    wait for that commit instead of each writing the row in a transaction of its own; a later expiry raises it
    again, and an earlier one never lowers it."""
    with pki_db.read_session() as s:
        ca = active_issuing(s, clock(), lock=False)
    updates: list[str] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(f"UPDATE {CertificateAuthority.__tablename__.upper()} "):
            updates.append(statement)

    sqlalchemy_event.listen(pki_db.engine, "before_cursor_execute", watch)
    expiry = clock() + timedelta(days=3)
    threads = [threading.Thread(target=publish_until, args=(pki_db, ca, expiry)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(updates) == 1 and _stored_until(pki_db, ca.id) == expiry
    publish_until(pki_db, ca, expiry - timedelta(seconds=5))  # known to be covered: nothing written
    assert len(updates) == 1
    publish_until(pki_db, ca, expiry + timedelta(seconds=1))
    assert len(updates) == 2 and _stored_until(pki_db, ca.id) == expiry + timedelta(seconds=1)


def _stored_until(db: Database, ca_id: str) -> datetime:
    with db.read_session() as s:
        ca = s.get(CertificateAuthority, ca_id)
        assert ca is not None and ca.signed_until is not None
        return as_utc(ca.signed_until)


def _openssl_verify(tmp_path: Path, roots_pem: bytes, intermediate_pem: bytes, leaf_pem: bytes,
                    at: datetime) -> subprocess.CompletedProcess[str]:
    (tmp_path / "roots.pem").write_bytes(roots_pem)
    (tmp_path / "issuing.pem").write_bytes(intermediate_pem)
    (tmp_path / "leaf.pem").write_bytes(leaf_pem)
    return subprocess.run(["openssl", "verify", "-attime", str(int(at.timestamp())), "-CAfile", "roots.pem",
                           "-untrusted", "issuing.pem", "leaf.pem"], cwd=tmp_path, capture_output=True, text=True)


def test_an_svid_issued_after_a_rotation_carries_the_new_issuer_and_chains_to_the_new_ca(
        pki_db: Database, keystore: FileKeyStore, clock: FrozenClock, tmp_path: Path) -> None:
    """What a process keeps per issuing CA (the leaf template with its issuer name and AKI, pki/x509svid.py; the
    facts, pki/service.py) follows a rotation: the next SVID names the new issuing CA, its AKI is that CA's SKI,
    and openssl verifies it through the new CA only."""
    committer = GroupCommitter(pki_db)
    first = _issue(pki_db, committer, keystore, clock)  # the template and the facts of generation 1 are kept
    with pki_db.session() as s:
        status = service.rotate(s, keystore, force=True, actor=ADMIN, clock=clock)
    assert status.activated == 2
    second = _issue(pki_db, committer, keystore, clock)
    committer.close()
    with pki_db.read_session() as s:
        cas = {ca.id: ca for ca in s.exec(select(CertificateAuthority)).all()}
        roots = service.bundle_pem(s)
    assert second.issuer_ca_id != first.issuer_ca_id
    new_ca = x509.load_pem_x509_certificate(cas[second.issuer_ca_id].cert_pem.encode())
    old_ca = x509.load_pem_x509_certificate(cas[first.issuer_ca_id].cert_pem.encode())
    assert second.chain_pem == [cas[second.issuer_ca_id].cert_pem.encode()]
    for issued, ca in ((first, old_ca), (second, new_ca)):
        leaf = x509.load_pem_x509_certificate(issued.cert_pem)
        assert leaf.issuer == ca.subject
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        assert aki.key_identifier == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert new_ca.subject != old_ca.subject
    ok = _openssl_verify(tmp_path, roots, second.chain_pem[0], second.cert_pem, clock())
    assert ok.returncode == 0 and "leaf.pem: OK" in ok.stdout, ok.stdout + ok.stderr
    through_old = _openssl_verify(tmp_path, roots, first.chain_pem[0], second.cert_pem, clock())
    assert through_old.returncode != 0  # the new leaf really names (and is signed by) the new CA, not the old one


def test_the_svid_row_a_batch_writes_reads_back_as_its_certificate_says(
        pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    """The rows go to the driver straight (pki/issuance.py _insert_svids): every column as the ORM reads it."""
    committer = GroupCommitter(pki_db)
    issued = [_issue(pki_db, committer, keystore, clock) for _ in range(3)]
    committer.close()
    for one in issued:
        cert = x509.load_pem_x509_certificate(one.cert_pem)
        with pki_db.read_session() as s:
            row = s.get(IssuedSvid, one.serial)
            assert row is not None
            assert (row.kind, row.spiffe_id, row.tenant, row.group, row.workload, row.node, row.issuer_ca_id) == (
                "workload", one.spiffe_id, "acme", "web", "frontend", None, one.issuer_ca_id)
            assert as_utc(row.not_before) == cert.not_valid_before_utc
            assert as_utc(row.not_after) == cert.not_valid_after_utc == one.expires_at
            assert as_utc(row.created_at) == clock()
            assert row.revoked_at is None and row.revocation_reason is None
            assert service.svid_tenant(s, one.serial) == "acme"
    with pki_db.session() as s:  # and a revocation by serial finds it
        assert service.revoke(s, serial=issued[0].serial, reason="test", actor=ADMIN, scope_tenant=None,
                              clock=clock) == [issued[0].serial]
    with pki_db.read_session() as s:
        assert issued[0].serial in service.revoked_serials(s)


def test_a_batch_signs_with_its_read_connection_given_back(pki_db: Database, keystore: FileKeyStore,
                                                           clock: FrozenClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix (review): issue_x509_svids_grouped kept its read session's connection while it signed each SVID and
    raised its CA's signed_until, which takes a connection of its own from the same pool: two at once per request,
    so as many API workers as the pool's size could all wait for a second one (10 s, then 503). Now the facts are
    read first and the connection given back before any signature: at each publish_until this thread holds none."""
    held: list[int] = []
    real = publish_until  # the function pki.service calls, by this name

    def publish_until_seen(db: Database, issuer: CertificateAuthority, until: datetime) -> None:
        held.append(db.engine.pool.checkedout())  # type: ignore[attr-defined]
        real(db, issuer, until)

    monkeypatch.setattr(service, "publish_until", publish_until_seen)
    committer = GroupCommitter(pki_db)
    asks = [service.X509Ask(csr_pem=make_csr(), tenant=t, group=g, workload=w)
            for t, g, w in (("acme", "web", "frontend"), ("acme", "web", "backend"), ("globex", "train", "trainer-0"))]
    for a in asks:  # read in the batch's read session, not kept from another test
        service._facts.drop((pki_db.url, a.tenant, a.group, a.workload, None, None))
    outcomes = service.issue_x509_svids_grouped(pki_db, committer, keystore, asks, actor=ADMIN, scope_tenant=None,
                                                clock=clock)
    committer.close()
    assert all(isinstance(o, service.IssuedX509) for o in outcomes), outcomes
    assert held == [0, 0, 0]
