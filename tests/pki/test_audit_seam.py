"""Every successful PKI mutation appends exactly its audit event(s) in the same transaction, naming the
actor and tenant; a failure inside the transaction leaves neither the change nor the event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import col, select

from audit.models import AuditEvent
from core.clock import FrozenClock
from keys.file import FileKeyStore
from pki import service
from store.db import Database
from tests.pki.helpers import ADMIN, counts, make_csr


def _events_since(db: Database, seq: int) -> list[AuditEvent]:
    with db.read_session() as s:
        return list(s.exec(select(AuditEvent).where(col(AuditEvent.seq) > seq).order_by(col(AuditEvent.seq))).all())


def _head(db: Database) -> int:
    with db.read_session() as s:
        row = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc())).first()
        return -1 if row is None else row.seq


def test_each_mutation_records_exactly_its_events(pki_db: Database, keystore: FileKeyStore,
                                                  clock: FrozenClock) -> None:
    steps: list[tuple[str, int]] = []  # (expected actions, SVID rows added)

    def step(expected: list[str], svids: int, fn: object) -> None:
        seq, (n_svid, _n_events) = _head(pki_db), counts(pki_db)
        with pki_db.session() as s:
            fn(s)  # type: ignore[operator]
        events = _events_since(pki_db, seq)
        assert [e.action for e in events] == expected
        assert counts(pki_db)[0] == n_svid + svids
        steps.append((",".join(expected), svids))

    issued: dict[str, str] = {}

    def x509(s: object) -> None:
        issued["serial"] = service.issue_x509_svid(
            s, keystore, csr_pem=make_csr(), tenant="acme", group="web", workload="frontend", ttl=None,  # type: ignore[arg-type]
            actor=ADMIN, scope_tenant=None, clock=clock, request_id="r-1").serial

    step(["svid.issue"], 1, x509)
    step(["svid.jwt.issue"], 0, lambda s: service.issue_jwt_svid(
        s, keystore, tenant="acme", group="web", workload="frontend", audience=["a"], ttl=None, actor=ADMIN,
        scope_tenant=None, clock=clock))
    step(["svid.revoke"], 0, lambda s: service.revoke(s, serial=issued["serial"], reason="r", actor=ADMIN,
                                                      scope_tenant=None, clock=clock))
    step(["identity.revoke"], 0, lambda s: service.revoke(s, tenant="globex", reason="r", actor=ADMIN,
                                                          scope_tenant=None, clock=clock))
    token: dict[str, str] = {}

    def mk_token(s: object) -> None:
        token["t"] = service.create_join_token(s, node_name="gpu-01", actor=ADMIN, clock=clock)  # type: ignore[arg-type]

    step(["node.token.create"], 0, mk_token)
    step(["node.attest"], 1, lambda s: service.attest_node(s, keystore, token=token["t"], csr_pem=make_csr(),
                                                           clock=clock))
    step(["ca.prepare", "ca.activate"], 0, lambda s: service.rotate(s, keystore, force=True, actor=ADMIN,
                                                                    clock=clock))
    clock.advance(timedelta(hours=2))
    step(["ca.retire"], 0, lambda s: service.rotate(s, keystore, force=False, actor=ADMIN, clock=clock))
    step([], 0, lambda s: service.rotate(s, keystore, force=False, actor=ADMIN, clock=clock))  # nothing due
    assert len(steps) == 9
    first = _events_since(pki_db, 0)
    issue = next(e for e in first if e.action == "svid.issue")
    assert (issue.actor_id, issue.actor_kind, issue.tenant, issue.request_id) == ("admin", "admin", "acme", "r-1")
    attest = next(e for e in first if e.action == "node.attest")
    assert attest.actor_kind == "node" and attest.actor_id == "spiffe://example.org/node/gpu-01"  # as its mTLS requests


def test_a_failure_later_in_the_transaction_rolls_back_issuance_and_event(
    pki_db: Database, keystore: FileKeyStore, clock: FrozenClock
) -> None:
    before = counts(pki_db)
    with pytest.raises(RuntimeError), pki_db.session() as s:
        service.issue_x509_svid(s, keystore, csr_pem=make_csr(), tenant="acme", group="web", workload="frontend",
                                ttl=None, actor=ADMIN, scope_tenant=None, clock=clock)
        raise RuntimeError("caller fails after issuance")
    assert counts(pki_db) == before
