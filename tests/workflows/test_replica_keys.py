"""Issue 11: replicas on one database, each with a data directory of its own and the same master key. A CA rotation
on replica A made the new generation's keys in A's keys/ only: replica B then answered `404 key_not_found` to every
JWT-SVID and X.509-SVID of the new generation. Keys now reach every replica through the database, encrypted."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from spiffe import JwtBundle, JwtSvid, TrustDomain
from sqlmodel import col, select

from audit.checkpoint import AUDIT_KEY_ID
from audit.errors import InvalidAuditEvent
from audit.models import AuditEvent
from core.clock import FrozenClock
from keys.errors import WrongMasterKey
from keys.file import FileKeyStore
from keys.models import KeyBlob
from keys.shared import SharedKeyStore
from keys.store import KeyKind
from pki import service
from pki.ca import BACKDATE
from pki.errors import ForeignKeyStore
from pki.models import CertificateAuthority
from pki.service import DEFAULT_CA_TTL
from pki.tokens.service import API_ISSUER_KEY_ID
from store.db import Database
from tests.pki.helpers import ADMIN, TD, make_csr, register, verify_chain
from workflows.context import AppContext
from workflows.init import discard_unused_ca_keys, initialize


def _clock() -> FrozenClock:
    """Starts so far back that the first generation's activation of its successor falls a minute before the real
    now: py-spiffe checks a JWT-SVID's times against the real clock."""
    life = DEFAULT_CA_TTL + BACKDATE
    return FrozenClock(datetime.now(UTC).replace(microsecond=0) - (DEFAULT_CA_TTL - life / 6) - timedelta(minutes=1))


def _replica(a: AppContext, home: Path, *, keys: bool = True, master: bool = True) -> AppContext:
    """A second data directory on A's database: a copy of A's keys/ (`keys`) and master key file (`master`; else a
    master key of its own)."""
    home.mkdir(mode=0o700)
    if keys:
        shutil.copytree(a.settings.keys_dir, home / "keys")
    if master:
        shutil.copy2(a.settings.default_key_file, home / "master.key")
    else:
        FileKeyStore.create_key_file(home / "master.key")
    return AppContext.open(replace(a.settings, home=home, database_url=a.settings.db_url), create=True, clock=a.clock)


def _issue(ctx: AppContext) -> tuple[service.IssuedX509, str]:
    with ctx.db.session() as s:
        x509 = service.issue_x509_svid(s, ctx.keystore, csr_pem=make_csr(), tenant="acme", group="web",
                                       workload="frontend", ttl=None, actor=ADMIN, scope_tenant=None, clock=ctx.clock)
    with ctx.db.session() as s:
        jwt = service.issue_jwt_svid(s, ctx.keystore, tenant="acme", group="web", workload="frontend",
                                     audience=["a"], ttl=None, actor=ADMIN, scope_tenant=None, clock=ctx.clock)
    return x509, jwt.token


def _verify(ctx: AppContext, x509: service.IssuedX509, token: str) -> None:
    """Both SVIDs verify against the trust bundle as `ctx` serves it."""
    with ctx.db.read_session() as s:
        roots, jwks = service.bundle_pem(s), service.bundle_jwks(s)
    verify_chain(x509.cert_pem, x509.chain_pem, roots, ctx.clock())
    keys = [k for k in jwks["keys"] if k["use"] == "jwt-svid"]
    JwtSvid.parse_and_validate(token, JwtBundle.parse(TrustDomain(TD), json.dumps({"keys": keys}).encode()), {"a"})


@pytest.fixture
def a(ctx: AppContext) -> AppContext:
    """Replica A: the data directory `init` ran in, with a workload registered, its clock injected."""
    a = replace(ctx, clock=_clock())
    initialize(a, TD, "ec-p256")
    with a.db.session() as s:
        register(s, "acme", "web", "frontend")
    return a


def test_a_rotation_on_one_replica_signs_on_the_other(a: AppContext, tmp_path: Path) -> None:
    b = _replica(a, tmp_path / "b")
    try:
        with a.db.read_session() as s:
            status = service.ca_status(s, a.clock)
        assert status.next_prepare_at is not None and status.next_activate_at is not None
        clock = a.clock
        assert isinstance(clock, FrozenClock)
        clock.now = status.next_prepare_at
        with a.db.session() as s:
            assert service.rotate(s, a.keystore, force=False, actor=ADMIN, clock=clock).prepared == 2
        clock.now = status.next_activate_at
        with a.db.session() as s:
            assert service.rotate(s, a.keystore, force=False, actor=ADMIN, clock=clock).activated == 2
        x509, token = _issue(b)  # before the fix: KeyNotFound, "no key 'ca-g2-issuing-…' in the key store at …"
        assert x509.issuer_ca_id == "g2-issuing"
        for ctx in (a, b):
            _verify(ctx, x509, token)
        _verify(b, *_issue(a))
    finally:
        b.close()


def test_a_replica_with_the_master_key_and_an_empty_keys_dir_fetches_the_keys(a: AppContext, tmp_path: Path) -> None:
    """The keys `init` made are published too: a data directory given only the master key file joins."""
    b = _replica(a, tmp_path / "b", keys=False)
    try:
        assert initialize(b, None, "ec-p256")["created"] is False  # before the fix: ForeignKeyStore, "has no key"
        for key_id in (AUDIT_KEY_ID, API_ISSUER_KEY_ID):
            assert b.keystore.get(key_id).public_key() == a.keystore.get(key_id).public_key()
        assert isinstance(b.clock, FrozenClock)
        b.clock.now = datetime.now(UTC).replace(microsecond=0)  # g1 signs now: its JWT-SVIDs live 5 real minutes
        x509, token = _issue(b)
        assert x509.issuer_ca_id == "g1-issuing"
        _verify(a, x509, token)
    finally:
        b.close()


def test_a_replica_with_another_master_key_is_refused_naming_the_cause(a: AppContext, tmp_path: Path) -> None:
    b = _replica(a, tmp_path / "b", keys=False, master=False)
    try:
        with pytest.raises(ForeignKeyStore, match=r"has no key 'ca-g1-root-.* does not decrypt under the master key "
                                                  r"of the key store at .*/b/keys: it was made under another"):
            initialize(b, None, "ec-p256")
        assert isinstance(b.keystore, SharedKeyStore)
        with pytest.raises(WrongMasterKey, match="does not decrypt under the master key"):
            b.keystore.get(AUDIT_KEY_ID)
        assert sorted(p.name for p in (tmp_path / "b" / "keys").iterdir()) == ["master.check"]  # nothing adopted
    finally:
        b.close()


def test_keys_made_before_sharing_are_shared_from_the_next_start(ctx: AppContext, tmp_path: Path) -> None:
    """An install upgraded to shared keys: its first CA generation, audit and API-issuer keys exist as files only,
    so a replica given only the master key was refused; the next `init` (which `serve` runs) publishes them."""
    a = replace(ctx, clock=_clock())
    assert isinstance(a.keystore, SharedKeyStore)
    initialize(replace(a, keystore=a.keystore.files), TD, "ec-p256")  # as before this version: files only
    with a.db.session() as s:
        register(s, "acme", "web", "frontend")
    early = _replica(a, tmp_path / "early", keys=False)
    try:
        with pytest.raises(ForeignKeyStore, match="has no key 'ca-g1-root-"):
            initialize(early, None, "ec-p256")
    finally:
        early.close()
    initialize(a, None, "ec-p256")  # the upgraded replica starts again
    b = _replica(a, tmp_path / "b", keys=False)
    try:
        assert initialize(b, None, "ec-p256")["created"] is False
        for key_id in (AUDIT_KEY_ID, API_ISSUER_KEY_ID):
            assert b.keystore.get(key_id).public_key() == a.keystore.get(key_id).public_key()
        assert isinstance(b.clock, FrozenClock)
        b.clock.now = datetime.now(UTC).replace(microsecond=0)
        x509, token = _issue(b)
        _verify(a, x509, token)
        assert a.keystore.publish_held([AUDIT_KEY_ID]) == []  # once published, a start publishes nothing more
    finally:
        b.close()


def _keys(ctx: AppContext) -> tuple[set[str], set[str], set[str]]:
    """The key ids CA rows name (in any state), those with a row in key_blobs, and those with a file in ctx's keys/."""
    with ctx.db.read_session() as s:
        named = {k for ca in s.exec(select(CertificateAuthority)).all() for k in (ca.key_id, ca.jwt_key_id) if k}
        rows = set(s.exec(select(KeyBlob.key_id)).all())
    files = {p.name.removesuffix(".key") for p in ctx.settings.keys_dir.glob("*.key")}
    return named, rows, files


class _Failed(Exception):
    pass


def _refused_audit_event(ctx: AppContext) -> None:
    """A rotation whose ca.prepare event is refused (a request id over the limit), after it made its keys."""
    with pytest.raises(InvalidAuditEvent, match="request id"), ctx.db.session() as s:
        service.rotate(s, ctx.keystore, force=True, actor=ADMIN, clock=ctx.clock, request_id="r" * 129)


def _failure_after_the_rotation(ctx: AppContext) -> None:
    """A step after the rotation, in its transaction, fails."""
    with pytest.raises(_Failed), ctx.db.session() as s:
        assert service.rotate(s, ctx.keystore, force=True, actor=ADMIN, clock=ctx.clock).prepared == 2
        raise _Failed


@pytest.mark.parametrize("fail", [_refused_audit_event, _failure_after_the_rotation])
def test_a_rotation_that_rolls_back_leaves_no_key_row_nor_file(a: AppContext, tmp_path: Path,
                                                              fail: Callable[[AppContext], None]) -> None:
    """Should fix: on PostgreSQL the new generation's key rows committed before the rotation, and stayed when it
    rolled back (three keys no CA generation uses, for every replica to fetch); on both databases the key files
    stayed in the data directory of the replica that ran it."""
    before = _keys(a)
    assert before[0] < before[1] == before[2]  # every key published: the CA keys, audit and API-issuer keys
    fail(a)
    assert _keys(a) == before
    with a.db.session() as s:  # the rotation again: its keys commit with it, and the other replica signs with them
        assert service.rotate(s, a.keystore, force=True, actor=ADMIN, clock=a.clock).activated == 2
    named, rows, files = _keys(a)
    assert len(named) == len(before[0]) + 3 and named <= rows == files
    b = _replica(a, tmp_path / "b", keys=False)
    try:
        assert isinstance(b.clock, FrozenClock)
        b.clock.now = datetime.now(UTC).replace(microsecond=0)
        _verify(a, *_issue(b))
    finally:
        b.close()


def _leftovers(a: AppContext) -> dict[str, str]:
    """What rotations that rolled back left before the fix: on PostgreSQL a key's row and file (generate outside
    the rotation's transaction is what it did there), on SQLite its file only; the id of each, by kind."""
    assert isinstance(a.keystore, SharedKeyStore)
    a.keystore.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)
    a.keystore.generate("jwt-g2-0badc0de", KeyKind.EC_P256)
    a.keystore.files.generate("ca-g2-issuing-0badc0de", KeyKind.EC_P256)
    a.keystore.generate("not-a-ca-key", KeyKind.ED25519)  # unused too, but not of the CA key form: never removed
    return {"row": "ca-g2-root-0badc0de", "jwt row": "jwt-g2-0badc0de", "file only": "ca-g2-issuing-0badc0de"}


def test_init_removes_the_keys_no_ca_generation_uses_with_their_audit_events(
        a: AppContext, caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: the keys rotations that rolled back left stayed for ever (a rotation failing on every check of
    the background job left three a minute). init and serve now remove those the database proves its own: each
    row, with its file here; the data directory's files without a row when the database is its own SQLite file."""
    with a.db.session() as s:  # g1 retires: a retired generation's keys are still named by its CA rows, and kept
        assert service.rotate(s, a.keystore, force=True, actor=ADMIN, clock=a.clock).retired == [1]
    named, _rows, _files = _keys(a)
    left = _leftovers(a)
    own_sqlite = a.settings.database_url is None
    removed = sorted([left["row"], left["jwt row"], *([left["file only"]] if own_sqlite else [])])
    caplog.set_level(logging.WARNING, logger="workflows.init")
    assert initialize(a, None, "ec-p256")["created"] is False
    named_after, rows, files = _keys(a)
    assert named_after == named and named <= rows and named <= files
    assert {AUDIT_KEY_ID, API_ISSUER_KEY_ID, "not-a-ca-key"} <= rows & files
    assert not set(removed) & (rows | files)
    if not own_sqlite:  # a server database: a file here without a row may be another database's key
        assert left["file only"] in files
    with a.db.read_session() as s:
        events = s.exec(select(AuditEvent).where(AuditEvent.action == "ca.key.destroy").order_by(
            col(AuditEvent.seq))).all()
    assert [(e.object_type, e.object_id, e.actor_kind, e.actor_id) for e in events] == [
        ("key", k, "system", "init") for k in removed]
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.init"]
    assert lines == [f"removed {len(removed)} CA key(s) that no CA generation uses, made by rotations that rolled "
                     f"back: {', '.join(removed)}"]
    caplog.clear()
    assert initialize(a, None, "ec-p256")["created"] is False  # nothing left to remove: nothing written, no line
    assert not [r for r in caplog.records if r.name == "workflows.init"]
    with a.db.read_session() as s:
        assert len(s.exec(select(AuditEvent).where(AuditEvent.action == "ca.key.destroy")).all()) == len(removed)


@pytest.mark.parametrize("ctx", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_init_never_removes_the_keys_of_a_rotation_under_way(a: AppContext) -> None:
    """A replica not yet upgraded commits its rotation's key rows before the rotation (a key store on a Database of
    its own: no transaction of this thread to join there, as before the fix). Such rows look unused until the
    rotation commits: init waits for the trust domain settings lock the rotation holds, then finds them used.
    (On SQLite a rotation holds the writer lock, which the removal's write transaction waits for.)"""
    shared = a.keystore
    assert isinstance(shared, SharedKeyStore)
    elsewhere = Database(a.settings.db_url)
    made, go = threading.Event(), threading.Event()
    rotated: list[int | None] = []

    def rotate_as_before_the_fix() -> None:
        with a.db.session() as s:
            rotated.append(service.rotate(s, SharedKeyStore(shared.files, elsewhere), force=True, actor=ADMIN,
                                          clock=a.clock).prepared)
            made.set()
            go.wait(30)

    removed: list[list[str]] = []
    rotation = threading.Thread(target=rotate_as_before_the_fix)
    removal = threading.Thread(target=lambda: removed.append(discard_unused_ca_keys(a, shared)))
    try:
        rotation.start()
        assert made.wait(30) and rotated == [2]
        _named, rows, _files = _keys(a)
        assert len([k for k in rows if "-g2-" in k]) == 3  # committed, and no CA row that names them yet
        removal.start()
        deadline = time.monotonic() + 30
        while not _someone_waits_for_a_lock(a) and removal.is_alive():
            assert time.monotonic() < deadline, "the removal never waited for the rotation's lock"
            time.sleep(0.01)
    finally:
        go.set()
        rotation.join(30)
        if removal.ident is not None:
            removal.join(30)
        elsewhere.dispose()
    assert removed == [[]]
    named, rows, files = _keys(a)
    assert len([k for k in named if "-g2-" in k]) == 3 and named <= rows and named <= files


def _someone_waits_for_a_lock(ctx: AppContext) -> bool:
    with ctx.db.read_session() as s:
        return bool(s.connection().exec_driver_sql("SELECT count(*) > 0 FROM pg_locks WHERE NOT granted").scalar())
