"""init: the trust domain, keys, a bootstrap admin token and the shipped policy as version 1, once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from audit.checkpoint import AUDIT_KEY_ID
from core.errors import Unauthenticated
from pki.tokens.service import API_ISSUER_KEY_ID, opaque_token
from policy import service as policy_service
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
