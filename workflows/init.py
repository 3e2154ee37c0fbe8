"""Initialise a data directory: trust domain CAs, the audit and API-issuer keys, the bootstrap admin token
(expiring: TRUSTFABRIC_BOOTSTRAP_TOKEN_TTL_SECONDS, a day by default) and the shipped policies as version
1. Run by `trustfabric init` and by `trustfabric serve` before it serves; a second run changes nothing."""

from __future__ import annotations

from typing import Any

from audit import Actor, ensure_audit_key
from audit.checkpoint import AUDIT_KEY_ID
from keys.shared import SharedKeyStore
from keys.store import KeyKind
from pki.ca import check_keys as check_ca_keys
from pki.ca import key_ids_in_use
from pki.errors import ForeignKeyStore
from pki.service import init_trust_domain
from pki.service import trust_domain as existing_trust_domain
from pki.tokens.service import API_ISSUER_KEY_ID, create_opaque_token, ensure_issuer_key, has_admin_token
from policy import service as policy_service
from policy.shipped import REGO_DIR
from policy.versions import load_dir
from workflows.context import AppContext


def initialize(ctx: AppContext, trust_domain: str | None, key_kind: str) -> dict[str, Any]:
    """Create the trust domain, audit key and admin token when missing; a second run changes nothing. On a
    database whose trust domain exists, the key store must be the one it was made with: ForeignKeyStore, with
    nothing written, instead of new audit and API-issuer keys nobody else trusts (a replica given a data
    directory of its own). The file key store's keys made before keys were shared between replicas (an upgraded
    install) are shared from here on (keys/shared.py)."""
    with ctx.db.read_session() as session:
        found = existing_trust_domain(session)
        if found is not None:
            try:
                check_ca_keys(session, ctx.keystore)
            except ForeignKeyStore as exc:
                raise ForeignKeyStore(
                    f"{exc}: it is not the key store trust domain {found} in the database was made with; give this "
                    "data directory a copy of the first one's keys/ and master key (or the same passphrase or "
                    "PKCS#11 token)") from None
    ensure_audit_key(ctx.keystore)
    ensure_issuer_key(ctx.keystore)
    with ctx.db.session() as session:
        # serve without --trust-domain keeps whatever init created
        trust_domain = trust_domain or existing_trust_domain(session) or ctx.settings.trust_domain
        created = init_trust_domain(
            session, ctx.keystore, trust_domain=trust_domain, key_kind=KeyKind(key_kind), clock=ctx.clock
        )
        token = expires_at = None
        if not has_admin_token(session):
            ttl = ctx.settings.bootstrap_token_ttl
            token = create_opaque_token(
                session, role="admin", subject="admin", actor=Actor.system("init"), ttl=ttl, clock=ctx.clock,
                description="bootstrap admin token created by init",
            )
            expires_at = ctx.clock() + ttl
    if isinstance(ctx.keystore, SharedKeyStore):  # keys made before keys were shared (an upgrade): shared now
        with ctx.db.read_session() as session:
            in_use = key_ids_in_use(session)
        ctx.keystore.publish_held([*in_use, AUDIT_KEY_ID, API_ISSUER_KEY_ID])
    policy_version = seed_shipped_policy(ctx)
    return {"created": created, "trust_domain": trust_domain, "admin_token": token,
            "admin_token_expires_at": expires_at, "policy_version": policy_version}


def seed_shipped_policy(ctx: AppContext) -> int | None:
    """With no policy version at all, the shipped rego/ becomes version 1 and is activated, so a fresh
    install decides flows instead of denying everything for want of a policy. Skipped (None) when
    versions exist, or when activation needs a signature (outside development mode, or with policy keys
    configured: the security team signs and activates it then)."""
    actor = Actor.system("init")
    with ctx.db.session() as session:
        if policy_service.list_versions(session):
            return None
    prepared = policy_service.prepare(load_dir(REGO_DIR))
    with ctx.db.session() as session:
        version, _created = policy_service.upload(
            session, prepared, actor, now=ctx.clock(), note="shipped policies, seeded by init"
        )
        if ctx.settings.require_policy_signature:
            return None
        policy_service.activate(session, version.number or 0, actor, now=ctx.clock(), reason="initial policy")
        return version.number
