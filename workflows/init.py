"""Initialise a data directory: trust domain CAs, the audit and API-issuer keys, the bootstrap admin token
(expiring: TRUSTFABRIC_BOOTSTRAP_TOKEN_TTL_SECONDS, a day by default) and the shipped policies as version
1. Run by `trustfabric init` and by `trustfabric serve` before it serves; a second run changes nothing, but for
removing CA keys no generation uses (discard_unused_ca_keys)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from audit import Actor, ensure_audit_key, record
from audit.checkpoint import AUDIT_KEY_ID
from keys.errors import KeyNotFound
from keys.shared import SharedKeyStore
from keys.store import KeyKind
from pki.ca import check_keys as check_ca_keys
from pki.ca import key_ids_in_use, unused_ca_key_ids
from pki.errors import ForeignKeyStore
from pki.service import init_trust_domain
from pki.service import trust_domain as existing_trust_domain
from pki.tokens.service import API_ISSUER_KEY_ID, create_opaque_token, ensure_issuer_key, has_admin_token
from policy import service as policy_service
from policy.shipped import REGO_DIR
from policy.versions import load_dir
from workflows.context import AppContext

_log = logging.getLogger(__name__)


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
        discard_unused_ca_keys(ctx, ctx.keystore)
    policy_version = seed_shipped_policy(ctx)
    return {"created": created, "trust_domain": trust_domain, "admin_token": token,
            "admin_token_expires_at": expires_at, "policy_version": policy_version}


def discard_unused_ca_keys(ctx: AppContext, keystore: SharedKeyStore) -> list[str]:
    """Remove the CA keys that no CA generation uses, row and file here, each with an audit event `ca.key.destroy`
    in the transaction that removes its row, and log one line naming them (ids only, never a key's bytes). The ids.

    Such a key is one a rotation (or init) made in a transaction that then rolled back: before keys/shared.py
    joined the rotation's transaction, its row stayed behind on PostgreSQL, and its file on every database; a
    process killed in mid-rotation still leaves its file. Removed rather than kept: nothing can ever use it (no CA
    row will name it: a retry makes keys of another suffix), the database and its backups would hold it, encrypted,
    for ever, and a rotation failing on every check of the background job left three a minute.

    What is looked at, so that no key anything could use is ever removed: only ids of the CA key form
    (pki.ca.CA_KEY_ID_RE; never the audit or API-issuer key), only under the trust domain settings lock every
    rotation holds from before it makes its keys until it ends (pki.ca.unused_ca_key_ids: a key of a rotation under
    way on any replica is never taken), and only keys provably this database's: its rows (and then their files
    here), and files of its keys/ only when the database is the data directory's own SQLite file. A data directory
    on a server database might hold another database's keys (pointed at another one once); a file there without a
    row is left. A first look without the lock keeps each start from writing when there is nothing to remove."""
    held = set(keystore.published_ids())
    if ctx.settings.database_url is None:
        held.update(keystore.files.key_ids())
    with ctx.db.read_session() as session:
        if not unused_ca_key_ids(session, held, lock=False):
            return []
    with ctx.db.session() as session:
        unused = unused_ca_key_ids(session, held)
        for key_id in unused:
            keystore.unpublish(key_id)
            record(session, actor=Actor.system("init"), action="ca.key.destroy", object_type="key", object_id=key_id,
                   summary={"reason": "no CA generation uses it (made in a transaction that rolled back)"},
                   at=ctx.clock())
    for key_id in unused:  # the file after the row's removal committed; no other replica fetched a key no CA names
        with contextlib.suppress(KeyNotFound):
            keystore.files.delete(key_id)
    if unused:
        _log.warning("removed %d CA key(s) that no CA generation uses, made by rotations that rolled back: %s",
                     len(unused), ", ".join(unused))
    return unused


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
