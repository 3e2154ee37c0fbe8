"""Initialise a data directory: the deployment id, trust domain CAs, the audit and API-issuer keys, the bootstrap
admin token (expiring: TRUSTFABRIC_BOOTSTRAP_TOKEN_TTL_SECONDS, a day by default) and the shipped policies as
version 1. Run by `trustfabric init` and by `trustfabric serve` before it serves; a second run changes nothing, but
for removing CA keys no generation uses (discard_unused_ca_keys)."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from audit import Actor, ensure_audit_key, record
from audit.checkpoint import AUDIT_KEY_ID
from audit.models import AuditEvent
from core.clock import as_utc
from core.errors import InvalidInput
from keys.adoption import Adoption, read_adoptions, spki_sha256
from keys.deployment import ORIGIN_INIT, ORIGIN_UPGRADE, read_deployment, read_deployment_id
from keys.errors import KeyNotFound, KeyStoreError
from keys.intents import ABANDONED_AFTER, forget, intents
from keys.models import Deployment
from keys.shared import SharedKeyStore
from keys.store import KeyKind, KeyStore, MarkedKeyStore
from pki.ca import CA_KEY_ID_RE, key_ids_in_use, reserve_generation_keys, unused_ca_key_ids
from pki.ca import check_keys as check_ca_keys
from pki.errors import ForeignKeyStore
from pki.models import CertificateAuthority
from pki.service import init_trust_domain
from pki.service import trust_domain as existing_trust_domain
from pki.tokens.service import API_ISSUER_KEY_ID, create_opaque_token, ensure_issuer_key, has_admin_token
from policy import service as policy_service
from policy.shipped import REGO_DIR
from policy.versions import load_dir
from workflows.adoption import (
    adopt_unmarked_keys,
    describe_missing,
    missing_adopted,
    unadopted_in_use,
    unlike_database,
)
from workflows.context import AppContext
from workflows.rotation import commit_in_time, mark_committed_keys, release_keys

_log = logging.getLogger(__name__)


def initialize(ctx: AppContext, trust_domain: str | None, key_kind: str) -> dict[str, Any]:
    """Create the trust domain, audit key and admin token when missing; a second run changes nothing. On a
    database whose trust domain exists, the key store must be the one it was made with: ForeignKeyStore, with
    nothing written, instead of new audit and API-issuer keys nobody else trusts (a replica given a data
    directory of its own). The file key store's keys made before keys were shared between replicas (an upgraded
    install) are shared from here on (keys/shared.py)."""
    found = _check_keys(ctx)
    ensure_deployment(ctx, upgrade=found is not None)  # before any key is made: the keys of a PKCS#11 token carry it
    # an upgraded deployment's unmarked keys: the only ones it uses from now on; a CA key in use it did not adopt (a
    # private object swapped) passed the check above, made before the adoption: checked again
    if adopt_unmarked_keys(ctx) is not None and found is not None:
        _check_keys(ctx)
    ensure_signing_keys(ctx)
    # a token's first CA keys: their intents commit before the transaction that makes them (keys/intents.py)
    reserved = None
    reserved_at = ctx.clock()
    if found is None and isinstance(ctx.keystore, MarkedKeyStore):
        reserved = reserve_generation_keys(ctx.db, reserved_at)
    try:
        with ctx.db.session() as session:
            # serve without --trust-domain keeps whatever init created
            trust_domain = trust_domain or existing_trust_domain(session) or ctx.settings.trust_domain
            created = init_trust_domain(
                session, ctx.keystore, trust_domain=trust_domain, key_kind=KeyKind(key_kind), clock=ctx.clock,
                reserved=reserved,
            )
            commit_in_time(ctx, reserved, reserved_at, reserved.generation if created and reserved else None)
            token = expires_at = None
            if not has_admin_token(session):
                ttl = ctx.settings.bootstrap_token_ttl
                token = create_opaque_token(
                    session, role="admin", subject="admin", actor=Actor.system("init"), ttl=ttl, clock=ctx.clock,
                    description="bootstrap admin token created by init",
                )
                expires_at = ctx.clock() + ttl
    except BaseException:
        release_keys(ctx, reserved)
        raise
    if not created:
        release_keys(ctx, reserved)  # a replica starting at once made the trust domain: these ids were never made
    if isinstance(ctx.keystore, SharedKeyStore):  # keys made before keys were shared (an upgrade): shared now
        with ctx.db.read_session() as session:
            in_use = key_ids_in_use(session)
        ctx.keystore.publish_held([*in_use, AUDIT_KEY_ID, API_ISSUER_KEY_ID])
        discard_unused_ca_keys(ctx, ctx.keystore)
    elif isinstance(ctx.keystore, MarkedKeyStore):  # a PKCS#11 token, perhaps shared with other deployments
        discard_unused_ca_keys(ctx, ctx.keystore)
    policy_version = seed_shipped_policy(ctx)
    return {"created": created, "trust_domain": trust_domain, "admin_token": token,
            "admin_token_expires_at": expires_at, "policy_version": policy_version}


def _check_keys(ctx: AppContext) -> str | None:
    """The database's trust domain (None before init); ForeignKeyStore, with why, unless the key store holds the key
    of every CA generation in use (pki/ca.py check_keys)."""
    refused: ForeignKeyStore | None = None
    with ctx.db.read_session() as session:
        found = existing_trust_domain(session)
        if found is not None:
            try:
                check_ca_keys(session, ctx.keystore)
            except ForeignKeyStore as exc:
                refused = exc
    if refused is None:
        return found
    gone = missing_adopted(ctx)  # the token's key a CA generation names was adopted, and is gone or replaced
    if gone:
        raise ForeignKeyStore(f"{refused}: {describe_missing(gone)}; restore it to the token") from None
    unadopted = unadopted_in_use(ctx)
    if unadopted:
        raise ForeignKeyStore(
            f"{refused}: the key(s) without a deployment marker the token holds under {', '.join(unadopted)} were not "
            "adopted by this deployment's first start on this version (not the key its certificate names, or a "
            "private object that does not sign under its public one: its start log and deployment.adopt audit event "
            "say which) and are never used; restore this deployment's key to the token") from None
    raise ForeignKeyStore(
        f"{refused}: it is not the key store trust domain {found} in the database was made with; give this "
        "data directory a copy of the first one's keys/ and master key (or the same passphrase or "
        "PKCS#11 token)") from None


def ensure_deployment(ctx: AppContext, *, upgrade: bool = False) -> str:
    """This database's deployment id (keys/deployment.py): made by the first init on a database without one, with an
    audit event `deployment.create`, in a transaction of its own that commits before init makes any key, so that the
    keys of an init killed midway carry the id later starts read. Written once: replicas starting together on one
    PostgreSQL race for the row, and the loser reads the winner's (the row's primary key decides).

    `upgrade`: the database holds a trust domain already, made before it had a deployment id, so its keys carry no
    marker: origin `upgrade`, whose lookups use unmarked keys as before. Else `init`: every key of this deployment is
    marked from birth, and an unmarked key in the token is never used (keys/pkcs11.py). An upgraded one's start then
    records which unmarked keys it adopts, the only ones it uses from then on (workflows/adoption.py)."""
    with ctx.db.statement() as conn:
        found = read_deployment_id(conn)
    if found is not None:
        return found
    made = secrets.token_hex(16)
    origin = ORIGIN_UPGRADE if upgrade else ORIGIN_INIT
    try:
        with ctx.db.session() as session:
            session.add(Deployment(id=1, deployment_id=made, created_at=ctx.clock(), origin=origin))
            session.flush()
            record(session, actor=Actor.system("init"), action="deployment.create", object_type="deployment",
                   object_id=made, summary={"marks": "the keys this database makes in a PKCS#11 token (CKA_ID)",
                                            "origin": origin}, at=ctx.clock())
    except IntegrityError:  # another replica starting at once wrote it first: theirs is the one
        pass
    with ctx.db.statement() as conn:
        found = read_deployment_id(conn)
    if found is None:
        raise RuntimeError("the deployment id was written, yet cannot be read back")
    if found == made and isinstance(ctx.keystore, MarkedKeyStore):
        _log.info("this database's deployment id is %s: it marks the keys this deployment makes in a PKCS#11 token",
                  made)
    elif found == made:  # the file key store's keys carry no marker: saying they do would mislead
        _log.info("this database's deployment id is %s", made)
    return found


def ensure_signing_keys(ctx: AppContext) -> None:
    """The audit checkpoint key and the API issuer key, each made when the key store holds none. In a PKCS#11 token,
    under the lock of this database's deployment row (on SQLite, its writer lock): a token has no create-if-absent,
    so replicas starting at once on a new deployment (a first rollout) each found no key and each made one, and the
    token then held several keys of one label, which every later start refused ("token holds 3 objects labelled
    'audit-checkpoint'") until an operator removed them by hand. Under the lock one replica makes them and the
    others find them. The file key store needs no lock: a key's row in `key_blobs` is unique (keys/shared.py)."""
    if not isinstance(ctx.keystore, MarkedKeyStore):
        ensure_audit_key(ctx.keystore)
        ensure_issuer_key(ctx.keystore)
        return
    keystore = ctx.keystore
    if not keystore.adopts_unmarked():  # made with markers, or adopted: an unmarked key of these labels is not its own
        owners = keystore.key_owners()
        with ctx.db.statement() as conn:  # (an adopted one missing or replaced: workflows/adoption.py says so)
            adopted = read_adoptions(conn)
        planted = [k for k in (AUDIT_KEY_ID, API_ISSUER_KEY_ID)
                   if k in owners and owners[k] is None and k not in adopted]
        if planted:
            _log.warning("%r holds key(s) without a deployment marker labelled %s: not used (this deployment was made "
                         "with markers, or adopted none of that label; an unmarked key is another's, or planted); it "
                         "signs with keys of its own, made now if missing; an operator judges whose the unmarked ones "
                         "are", keystore, ", ".join(planted))
    with ctx.db.session() as session:
        session.exec(select(Deployment.id).where(col(Deployment.id) == 1).with_for_update()).first()
        ensure_audit_key(keystore)
        ensure_issuer_key(keystore)


def discard_unused_ca_keys(ctx: AppContext, keystore: SharedKeyStore | MarkedKeyStore) -> list[str]:
    """Remove the CA keys that no CA generation uses, each with an audit event `ca.key.destroy` in the transaction
    that finds it unused, and log one line naming them (ids only, never a key's bytes). The ids. From a PKCS#11
    token, only this deployment's keys (discard_unused_token_keys); from the shared file store, as follows.

    The file key store: the key's row and its file here, the event in the transaction that removes its row.

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
    if not isinstance(keystore, SharedKeyStore):
        return discard_unused_token_keys(ctx, keystore)
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


def discard_unused_token_keys(ctx: AppContext, keystore: MarkedKeyStore) -> list[str]:
    """Destroy the CA keys of a PKCS#11 token that carry this database's deployment marker, that no CA generation of
    it names, and that this database recorded it was about to make (an intent, keys/intents.py), private and public
    object, each with an audit event `ca.key.destroy` (naming the intent's time) in the transaction that deletes its
    intent; one log line naming them. The ids. Such a key is one a rotation (or init) made in a process killed
    before its commit (kill -9, power loss), or in a rotation that rolled back and whose destroy failed.

    Only with an intent: a key of this deployment that no CA row names and no intent names was made after this
    database's state, by a generation a restored backup does not know. Destroying it (irreversible in a token) would
    leave every later backup, or a point-in-time recovery, unable to start; it is left, and named in one warning line
    each start ("no CA row and no intent ..."), for an operator to judge.

    And only when the token says the key was never committed: a backup taken between a rotation's intents commit and
    its own holds the intents and no CA row, yet that rotation committed (in the live database, or a later state of
    this one). The token, never restored with a database, witnesses it: each key a committed CA row names is marked
    committed there after that commit (workflows/rotation.py mark_committed_keys; first here, for keys the CA rows of
    this database name whose mark a stopped process left undone, or made before the token was a witness). A key of
    this deployment the token says was committed and no CA row here names is left, named in one warning line each
    start ("committed by a later state of this deployment: not destroyed").

    And only once its intent is keys.intents.ABANDONED_AFTER old: a copy of this database (staging, a restore)
    started against the token while the live rotation is between making its keys and its commit sees intents, no CA
    row and no mark, as after a kill. The live rotation commits within COMMIT_WITHIN of its intents or rolls back
    (workflows/rotation.py commit_in_time), and marks them right after, so by then the token says committed, or the
    keys are a killed rotation's. A younger one is left for a later start, named in one warning line ("left for a
    later start").

    A token may be shared by several deployments (trust domains, databases): only keys whose marker (CKA_ID,
    keys/deployment.py) names this database's deployment id are ever taken, only ids of the CA key form
    (pki.ca.CA_KEY_ID_RE; never the audit or API-issuer key), decided under the trust domain settings lock every
    rotation holds from before it makes its keys until it ends (pki.ca.unused_ca_key_ids: a key of a rotation under
    way on any replica is never taken). Keys with another deployment's marker are left silently; unmarked CA-form
    keys that no CA row here names (made before keys were marked, or by another deployment or software) are left
    too, and named in one log line each start. The events commit first, then the keys go: a destroy that fails is
    logged and retried at the next start (its `ca.key.destroy` event stands for the intent the commit deleted). One
    event per key: a start that finds one recorded already (by a replica starting at once, which destroys it after
    its commit, or by a start whose destroy failed) destroys it unrecorded.

    The same transaction deletes the intents left without a purpose: of keys a CA row names (a rotation's own
    transaction deletes them; this is for any it could not), of keys the token says were committed (never destroyed:
    else each run of the token-keys job, tend_token_keys, would sweep again), and of keys the token does not hold,
    once older than
    keys.intents.ABANDONED_AFTER (a rotation that failed before making them; a younger one may be a rotation waiting
    for the lock). So the table holds only the intents of rotations under way or killed."""
    with ctx.db.statement() as conn:
        mine = read_deployment_id(conn)
        intended = intents(conn, mine) if mine is not None else {}
    if mine is not None:
        mark_committed_keys(ctx, keystore)  # the keys this database names: never destroyed, and now witnessed
    owners = keystore.key_owners()
    committed = keystore.committed_ids()
    held = [k for k, owner in owners.items() if mine is not None and owner == mine]
    unmarked = [k for k, owner in owners.items() if owner is None and CA_KEY_ID_RE.fullmatch(k)]
    with ctx.db.read_session() as session:  # a first look, without the lock
        candidates = unused_ca_key_ids(session, held, lock=False)
        unclaimed = unused_ca_key_ids(session, unmarked, lock=False)
        recorded = _recorded(session, candidates)
        named = _named_key_ids(session)
    if unclaimed:
        _log.warning("%r holds %d CA key(s) without a deployment marker that no CA generation of this database "
                     "uses, left as they are (made before keys were marked, or by another deployment or software; "
                     "an operator judges whose): %s", keystore, len(unclaimed), ", ".join(unclaimed))
    later = [k for k in candidates if k in committed]
    if later:
        _log.warning("%r holds %d CA key(s) of this deployment that no CA row of this database names and that the "
                     "token says were committed: committed by a later state of this deployment: not destroyed (a "
                     "restored backup, or a copy started against the production token?): %s", keystore, len(later),
                     ", ".join(later))
    unknown = [k for k in candidates if k not in intended and k not in recorded and k not in committed]
    if unknown:
        _log.warning("%r holds %d CA key(s) of this deployment with no CA row and no intent: made after this "
                     "database's state — a restored backup? — left as it is: %s", keystore, len(unknown),
                     ", ".join(unknown))
    stale = _stale_intents(ctx, intended, named | committed, set(held))
    if mine is None or (not stale and not [k for k in candidates if k not in unknown and k not in committed]):
        return []
    with ctx.db.session() as session:
        unused = unused_ca_key_ids(session, held)  # under the trust domain settings lock
        conn = session.connection()
        intended = intents(conn, mine)
        now_held = {k for k, owner in keystore.key_owners().items() if owner == mine}
        committed = keystore.committed_ids()  # the token's word, read again now that no rotation is under way
        # still there, still ours and never committed (by any state of this deployment)
        unused = [k for k in unused if k in now_held and k not in committed]
        # another start (a replica starting at once) recorded some already and destroys them after its commit, or
        # its destroy failed: destroyed here too, but recorded once (its event committed before this lock was had)
        recorded = _recorded(session, unused)
        # an intent younger than the bound may be a rotation under way in a copy of this database against this token
        # (a staging copy, a restore): its keys are left for a later start, by when that rotation has committed and
        # marked them (rotate_cas rolls back one that could not commit in time), or was killed
        now = ctx.clock()
        young = sorted(k for k in unused if k in intended and k not in recorded and not _old(intended[k], now))
        unused = [k for k in unused if k in recorded or (k in intended and k not in young)]
        for key_id in unused:
            if key_id in recorded:
                continue
            record(session, actor=Actor.system("init"), action="ca.key.destroy", object_type="key", object_id=key_id,
                   summary={"reason": "no CA generation uses it, and this database recorded it was about to make it "
                                      "(a rotation killed before its commit, or one that rolled back)",
                            "key_store": "pkcs11", "deployment": mine,
                            "intent_at": as_utc(intended[key_id]).isoformat()}, at=ctx.clock())
        forget(conn, [*unused, *_stale_intents(ctx, intended, _named_key_ids(session) | committed, now_held)])
    if young:
        due = min(as_utc(intended[k]) for k in young) + ABANDONED_AFTER
        _log.warning("%r holds %d CA key(s) of this deployment that no CA row names, made under an intent younger than "
                     "%s: left for a later start (a rotation under way in a copy of this database, against this "
                     "token, may yet commit them); a start from %s destroys them if still unused and never committed: "
                     "%s", keystore, len(young), _minutes(ABANDONED_AFTER), due.isoformat(), ", ".join(young))
    destroyed, failed = [], []
    for key_id in unused:
        try:
            found = keystore.destroy_marked(key_id, mine)
        except Exception as exc:  # the token refused: said, and tried again at the next start
            failed.append(f"{key_id} ({type(exc).__name__}: {exc})")
        else:
            if found:  # (else another start destroyed it meanwhile)
                destroyed.append(key_id)
    if destroyed:
        _log.warning("destroyed %d CA key(s) of this deployment in %r that no CA generation uses, made by rotations "
                     "that rolled back or were killed before their commit: %s", len(destroyed), keystore,
                     ", ".join(destroyed))
    if failed:
        _log.warning("could not destroy %d unused CA key(s) in %r, tried again at the next start: %s", len(failed),
                     keystore, "; ".join(failed))
    return destroyed


def tend_token_keys(ctx: AppContext) -> list[str]:
    """The token-keys background job on every replica (api/background.py), for a PKCS#11 token: the keys CA rows
    name are marked committed in the token (workflows/rotation.py mark_committed_keys; a CA row naming no new key
    costs no token read), and once an intent of this deployment is ABANDONED_AFTER old, the start's sweep runs
    (discard_unused_token_keys). Why not only at a start: a replica killed between its rotation's commit and the mark
    left the keys unmarked while the others served on, and a copy of the database taken mid-rotation (a staging copy
    started against the token) could destroy them; and a process killed before its commit and restarted at once
    leaves keys whose intents are young, left by that start. The ids destroyed; a file key store: []."""
    keystore = ctx.keystore
    if not isinstance(keystore, MarkedKeyStore):
        return []
    mark_committed_keys(ctx, keystore)
    with ctx.db.statement() as conn:
        mine = read_deployment_id(conn)
        intended = intents(conn, mine) if mine is not None else {}
    now = ctx.clock()
    if not any(_old(at, now) for at in intended.values()):
        return []
    return discard_unused_token_keys(ctx, keystore)


def _recorded(session: Any, key_ids: list[str]) -> set[str]:
    """Those of `key_ids` a `ca.key.destroy` event names."""
    if not key_ids:
        return set()
    return set(session.exec(select(AuditEvent.object_id).where(
        AuditEvent.action == "ca.key.destroy", col(AuditEvent.object_id).in_(key_ids))).all())


def _named_key_ids(session: Any) -> set[str]:
    """Every key id a CA row of this database names, in any state."""
    named: set[str] = set()
    for key_id, jwt_key_id in session.exec(select(CertificateAuthority.key_id, CertificateAuthority.jwt_key_id)):
        named.add(key_id)
        if jwt_key_id is not None:
            named.add(jwt_key_id)
    return named


def _old(intent_at: datetime, now: datetime) -> bool:
    """Whether an intent made at `intent_at` is at least ABANDONED_AFTER old at `now`: its rotation, wherever it ran,
    has committed (and marked its keys) or never will (workflows/rotation.py COMMIT_WITHIN)."""
    return now - as_utc(intent_at) >= ABANDONED_AFTER


def _minutes(delta: timedelta) -> str:
    return f"{int(delta.total_seconds() // 60)} minutes"


def _stale_intents(ctx: AppContext, intended: dict[str, Any], named: set[str], held: set[str]) -> list[str]:
    """The intents without a purpose: of a key a CA row (or the token's committed mark) names, or of a key not held,
    older than ABANDONED_AFTER."""
    now = ctx.clock()
    return sorted(k for k, at in intended.items()
                  if k in named or (k not in held and now - as_utc(at) >= ABANDONED_AFTER))


def token_keys(ctx: AppContext) -> list[dict[str, Any]]:
    """What `trustfabric ca keys` shows an operator: every private key in the PKCS#11 token, by id, with whose
    marker it carries (`this deployment`, `another deployment`, or `unmarked` and whether this deployment adopted it:
    _unmarked; its deployment id), the CA row of this database that names it, and what a start does with it by
    discard_unused_token_keys' rules. Reads only.
    InvalidInput for a key store that is not a token."""
    keystore = ctx.keystore
    if not isinstance(keystore, MarkedKeyStore):
        raise InvalidInput("`ca keys` lists the keys of a PKCS#11 token (TRUSTFABRIC_KEYSTORE=pkcs11): the file key "
                           "store holds this deployment's keys only, and a start removes those no CA generation uses")
    with ctx.db.statement() as conn:
        row = read_deployment(conn)
        adoptions = read_adoptions(conn)
    mine = None if row is None else row.deployment_id
    named: dict[str, str] = {}
    with ctx.db.read_session() as session:
        for ca in session.exec(select(CertificateAuthority)).all():
            named[ca.key_id] = ca.id
            if ca.jwt_key_id is not None:
                named[ca.jwt_key_id] = f"{ca.id} (JWT-SVIDs)"
        intended = intents(session.connection(), mine) if mine is not None else {}
        owners = keystore.key_owners()
        in_use = keystore.unmarked_in_use()
        # what the first start of an upgraded deployment (or of a database from before deployment ids) will refuse
        pending = {} if row is not None and not row.adopts_any_unmarked else unlike_database(
            session, keystore, _digests(keystore, in_use))
        committed = keystore.committed_ids()
        recorded = _recorded(session, sorted(k for k in owners if k not in named))
    rows = []
    now = ctx.clock()
    for key_id, owner in sorted(owners.items()):
        ours = mine is not None and owner == mine
        if key_id in named:
            verdict = "kept: a CA generation names it"
        elif owner is not None and not ours:
            verdict = "kept: another deployment's"
        elif not CA_KEY_ID_RE.fullmatch(key_id):
            verdict = "kept: not a CA key"
        elif owner is None:
            verdict = "kept: unmarked and unused here; an operator judges whose it is"
        elif key_id in committed:
            verdict = "kept: committed by a later state of this deployment: not destroyed"
        elif key_id in recorded or (key_id in intended and _old(intended[key_id], now)):
            verdict = ("destroyed: unused, and this database recorded it was about to make it (a rotation killed "
                       "before its commit; a rotation under way is waited for)")
        elif key_id in intended:
            due = as_utc(intended[key_id]) + ABANDONED_AFTER
            verdict = (f"kept for now: unused, and this database recorded it was about to make it less than "
                       f"{_minutes(ABANDONED_AFTER)} ago (a rotation under way, here or in a copy of this database "
                       f"against this token, may yet commit it); a start from {due.isoformat()} destroys it if still "
                       "unused and never committed")
        else:
            verdict = ("kept: no CA row and no intent: made after this database's state — a restored backup? — "
                       "left as it is")
        marker = ("this deployment" if ours else "another deployment" if owner is not None
                  else f"unmarked, used until the next start, which will not adopt it: {pending[key_id]}"
                  if key_id in pending else _unmarked(adoptions.get(key_id), key_id in in_use))
        rows.append({"key_id": key_id, "marker": marker, "deployment_id": owner, "named_by": named.get(key_id),
                     "at_start": verdict})
    return rows


def _digests(keystore: KeyStore, key_ids: Iterable[str]) -> dict[str, str]:
    """keys/adoption.py spki_sha256 of each of `key_ids`' public keys, those the key store finds whole."""
    found = {}
    for key_id in key_ids:
        try:
            found[key_id] = spki_sha256(keystore.get(key_id).public_key())
        except (KeyNotFound, KeyStoreError):  # (a pair without its public object: a start adopts none either)
            continue
    return found


def _unmarked(adopted: Adoption | None, used: bool) -> str:
    """`ca keys`' marker column for a key without a marker (the one of its label this deployment would use, else
    one): whether this deployment adopted it (keys/adoption.py), uses it before adopting (an upgraded deployment whose
    first start of this version is still to come, or a database before init), or never uses it."""
    if adopted is not None:
        when = adopted.adopted_at.isoformat()
        return f"unmarked, adopted at {when}" if used else f"unmarked, not the one adopted at {when}: never used"
    return "unmarked, used: adopted at the next start" if used else "unmarked, not adopted"


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
