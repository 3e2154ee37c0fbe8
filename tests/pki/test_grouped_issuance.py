"""Group-committed X.509-SVID issuance (pki.service.issue_x509_svid_grouped) on both databases: the same SVID
and audit event as the one-transaction path; and what changes between the signature and the commit wins:
an identity revoked meanwhile gets nothing (nothing written), a CA rotated meanwhile re-signs with the new
active CA. The changes are real transactions committed in that gap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlmodel import Session

from core.clock import FrozenClock
from keys.file import FileKeyStore
from pki import service
from pki.errors import IdentityRevoked
from store.db import Database
from store.groupcommit import GroupCommitter
from tests.pki.helpers import ADMIN, actions, counts, make_csr


class _Between(GroupCommitter):
    """A committer that commits `change` in its own transaction after the certificate was signed and before
    the SVID is recorded (once)."""

    def __init__(self, db: Database, change: Callable[[], None]) -> None:
        super().__init__(db)
        self._change: Callable[[], None] | None = change

    def submit(self, fn: Callable[[Session], Any], check: Any = None, *, savepoint: bool = True) -> Any:
        if self._change is not None:
            change, self._change = self._change, None
            change()
        return super().submit(fn, check, savepoint=savepoint)


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
