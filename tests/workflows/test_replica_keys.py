"""Issue 11: replicas on one database, each with a data directory of its own and the same master key. A CA rotation
on replica A made the new generation's keys in A's keys/ only: replica B then answered `404 key_not_found` to every
JWT-SVID and X.509-SVID of the new generation. Keys now reach every replica through the database, encrypted."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from spiffe import JwtBundle, JwtSvid, TrustDomain

from audit.checkpoint import AUDIT_KEY_ID
from core.clock import FrozenClock
from keys.errors import WrongMasterKey
from keys.file import FileKeyStore
from keys.shared import SharedKeyStore
from pki import service
from pki.ca import BACKDATE
from pki.errors import ForeignKeyStore
from pki.service import DEFAULT_CA_TTL
from pki.tokens.service import API_ISSUER_KEY_ID
from tests.pki.helpers import ADMIN, TD, make_csr, register, verify_chain
from workflows.context import AppContext
from workflows.init import initialize


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
    keys = [k for k in jwks["keys"] if k["use"] == "jwt-svid"]  # type: ignore[attr-defined]
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
