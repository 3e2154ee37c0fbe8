"""Join tokens: shown once, stored hashed, single use (also under a race), expiring; the node SVID is
spiffe://<td>/node/<name>. Every refused attempt leaves nothing behind."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlmodel import select

from core.clock import FrozenClock
from core.errors import InvalidInput
from keys.file import FileKeyStore
from pki import service
from pki.errors import InvalidCSR, TokenInvalid, TTLTooLong
from pki.models import JoinToken
from store.db import Database
from tests.pki.helpers import ADMIN, actions, counts, make_csr, verify_chain


def _token(db: Database, clock: FrozenClock, name: str = "gpu-01", ttl: timedelta | None = None) -> str:
    with db.session() as s:
        return service.create_join_token(s, node_name=name, ttl=ttl, actor=ADMIN, clock=clock)


def _attest(db: Database, ks: FileKeyStore, clock: FrozenClock, token: str, csr: bytes | None = None
            ) -> service.IssuedX509:
    with db.session() as s:
        return service.attest_node(s, ks, token=token, csr_pem=csr or make_csr(), clock=clock)


def test_token_exchanged_once_for_a_node_svid(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    token = _token(pki_db, clock)
    with pki_db.read_session() as s:
        row = s.exec(select(JoinToken)).one()
    assert row.token_hash != token and token not in repr(row.model_dump())
    issued = _attest(pki_db, keystore, clock, token)
    assert issued.spiffe_id == "spiffe://example.org/node/gpu-01"
    with pki_db.read_session() as s:
        roots = service.bundle_pem(s)
    verify_chain(issued.cert_pem, issued.chain_pem, roots, clock())
    assert actions(pki_db)[-2:] == ["node.token.create", "node.attest"]
    before = counts(pki_db)
    with pytest.raises(TokenInvalid, match="already used"):
        _attest(pki_db, keystore, clock, token)
    assert counts(pki_db) == before


def test_unknown_and_expired_tokens(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    token = _token(pki_db, clock, ttl=timedelta(minutes=10))
    before = counts(pki_db)
    with pytest.raises(TokenInvalid, match="unknown"):
        _attest(pki_db, keystore, clock, "tfjt_" + "x" * 43)
    with pytest.raises(TokenInvalid):
        _attest(pki_db, keystore, clock, "")
    clock.advance(timedelta(minutes=10))
    with pytest.raises(TokenInvalid, match="expired"):
        _attest(pki_db, keystore, clock, token)
    assert counts(pki_db) == before


def test_a_token_used_on_another_node_is_refused_unspent(pki_db: Database, keystore: FileKeyStore,
                                                        clock: FrozenClock) -> None:
    token = _token(pki_db, clock, name="gpu-02")
    before = counts(pki_db)
    with pki_db.session() as s, pytest.raises(TokenInvalid, match="join token is for node gpu-02, not gpu-03"):
        service.attest_node(s, keystore, token=token, csr_pem=make_csr(), clock=clock, node_name="gpu-03")
    assert counts(pki_db) == before  # nothing issued, nothing audited, the token not spent
    with pki_db.session() as s:
        issued = service.attest_node(s, keystore, token=token, csr_pem=make_csr(), clock=clock, node_name="gpu-02")
    assert issued.spiffe_id.endswith("/node/gpu-02")


def test_bad_csr_does_not_burn_the_token(sqlite_pki: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    token = _token(sqlite_pki, clock)
    before = counts(sqlite_pki)
    with pytest.raises(InvalidCSR):
        _attest(sqlite_pki, keystore, clock, token, csr=b"junk")
    assert counts(sqlite_pki) == before
    assert _attest(sqlite_pki, keystore, clock, token).spiffe_id.endswith("/node/gpu-01")


def test_token_request_validation(sqlite_pki: Database, clock: FrozenClock) -> None:
    before = counts(sqlite_pki)
    with pytest.raises(InvalidInput):
        _token(sqlite_pki, clock, name="Bad_Name")
    with pytest.raises(TTLTooLong):
        _token(sqlite_pki, clock, ttl=timedelta(days=8))
    with pytest.raises(InvalidInput):
        _token(sqlite_pki, clock, ttl=timedelta(0))
    assert counts(sqlite_pki) == before


def test_single_use_under_concurrency(pki_db: Database, keystore: FileKeyStore, clock: FrozenClock) -> None:
    token = _token(pki_db, clock)
    barrier = threading.Barrier(4)
    results: list[str] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        try:
            _attest(pki_db, keystore, clock, token)
            outcome = "ok"
        except TokenInvalid:
            outcome = "refused"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == ["ok", "refused", "refused", "refused"]
    assert actions(pki_db).count("node.attest") == 1
