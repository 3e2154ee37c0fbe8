"""init: the trust domain, keys, a bootstrap admin token and the shipped policy as version 1, once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from audit.checkpoint import AUDIT_KEY_ID
from core.errors import InvalidInput, Unauthenticated
from keys.errors import KeyExists
from keys.shared import SharedKeyStore
from keys.store import KeyKind
from pki.ca import generation_cas
from pki.errors import ForeignKeyStore
from pki.tokens.service import API_ISSUER_KEY_ID, opaque_token
from policy import service as policy_service
from tests.api.conftest import make_settings, open_context
from workflows.context import AppContext
from workflows.init import initialize


def test_init_makes_everything_once(ctx: AppContext) -> None:
    first = initialize(ctx, "example.org", "ec-p256")
    assert first["created"] is True and first["trust_domain"] == "example.org" and first["policy_version"] == 1
    assert str(first["admin_token"]).startswith("tfo_")
    assert ctx.keystore.exists(AUDIT_KEY_ID) and ctx.keystore.exists(API_ISSUER_KEY_ID)
    with ctx.db.read_session() as s:
        assert opaque_token(s, str(first["admin_token"]), ctx.clock).role == "admin"
        active = policy_service.active_version(s)
        assert active is not None and active.number == 1 and "api_authz.rego" in active.modules
    again = initialize(ctx, None, "ec-p256")  # serve without --trust-domain keeps what init made
    assert again == {"created": False, "trust_domain": "example.org", "admin_token": None,
                     "admin_token_expires_at": None, "policy_version": None}


def test_the_bootstrap_admin_token_expires(ctx: AppContext) -> None:
    """Should fix: the bootstrap admin token never expired on the code before the fix."""
    token = str(initialize(ctx, "example.org", "ec-p256")["admin_token"])
    later = ctx.clock() + ctx.settings.bootstrap_token_ttl
    with ctx.db.read_session() as s:
        assert opaque_token(s, token, lambda: later - timedelta(minutes=1)).role == "admin"
        with pytest.raises(Unauthenticated, match="token expired"):
            opaque_token(s, token, lambda: later + timedelta(seconds=1))


def test_outside_development_mode_the_shipped_policy_waits_for_a_signed_activation(ctx: AppContext) -> None:
    production = AppContext(settings=replace(ctx.settings, mode="production"), db=ctx.db, keystore=ctx.keystore,
                            clock=ctx.clock)
    assert initialize(production, "example.org", "ec-p256")["policy_version"] is None
    with ctx.db.read_session() as s:
        assert policy_service.active_version(s) is None


def test_with_signing_keys_the_shipped_policy_waits_for_a_signed_activation(ctx: AppContext, tmp_path: Path) -> None:
    pem = tmp_path / "policy.pub"
    pem.write_bytes(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    signed = AppContext(settings=replace(ctx.settings, policy_verify_keys=(pem,)), db=ctx.db,
                        keystore=ctx.keystore, clock=ctx.clock)
    assert initialize(signed, "example.org", "ec-p256")["policy_version"] is None
    with ctx.db.read_session() as s:
        assert policy_service.active_version(s) is None
        assert [v.state for v in policy_service.list_versions(s)] == ["candidate"]


def _snapshot(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def test_a_replica_without_the_key_store_is_refused_and_writes_nothing(ctx: AppContext, tmp_path: Path) -> None:
    """Should fix: a replica given an empty data directory of its own on an initialised database made a master
    key, audit and API-issuer keys of its own and served: its tokens were refused by the other replicas, and
    the audit checkpoints it signed failed `audit verify` against the trust domain's audit public key."""
    initialize(ctx, "example.org", "ec-p256")
    stray = tmp_path / "stray"
    stray.mkdir(mode=0o700)
    joining = replace(ctx.settings, home=stray, database_url=ctx.settings.db_url)
    with pytest.raises(InvalidInput, match=r"no master key file .*/stray/master\.key, and trust domain example\.org"):
        AppContext.open(joining, create=True)
    assert _snapshot(stray) == {} and not (stray / "keys").exists()


def test_a_replica_with_another_key_store_is_refused_and_writes_nothing(ctx: AppContext, tmp_path: Path) -> None:
    """Should fix: a data directory initialised on its own (its own CA keys), pointed at a database whose trust
    domain exists, served with audit and issuer keys nobody else trusts; so did one whose key has the CA key's
    name but not its key."""
    initialize(ctx, "example.org", "ec-p256")
    other = open_context(make_settings(tmp_path / "other"))  # a key store of its own (and a database, unused)
    try:
        initialize(other, "example.org", "ec-p256")
    finally:
        other.close()
    before = _snapshot(tmp_path / "other")
    joining = AppContext.open(replace(ctx.settings, home=tmp_path / "other", database_url=ctx.settings.db_url),
                              create=True)
    try:
        with pytest.raises(ForeignKeyStore, match=r"has no key 'ca-g1-root-.*it is not the key store trust domain "
                                                  r"example\.org in the database was made with"):
            initialize(joining, None, "ec-p256")
        assert _snapshot(tmp_path / "other") == before
        with ctx.db.read_session() as s:
            root = next(ca for ca in generation_cas(s, ("active",)) if ca.role == "root")
        shared = joining.keystore
        assert isinstance(shared, SharedKeyStore)
        with pytest.raises(KeyExists, match="published in the database's shared keys"):
            shared.generate(root.key_id, KeyKind.EC_P256)  # an id the trust domain holds is never made again
        shared.files.generate(root.key_id, KeyKind.EC_P256)  # a key file of the name the database expects, another key
        before = _snapshot(tmp_path / "other")
        with pytest.raises(ForeignKeyStore, match=f"key {root.key_id!r} is not the one CA g1-root uses"):
            initialize(joining, None, "ec-p256")
    finally:
        joining.close()
    assert _snapshot(tmp_path / "other") == before
    # the data directory the trust domain was made with still opens and initialises as before
    again = AppContext.open(ctx.settings, create=True)
    try:
        assert initialize(again, None, "ec-p256")["created"] is False
    finally:
        again.close()
