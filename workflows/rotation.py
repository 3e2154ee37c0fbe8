"""A CA rotation as a server runs it (the background job, `POST /ca/rotate`, `trustfabric ca rotate`): in a PKCS#11
token, the key ids of a generation it will prepare are reserved first, their intents committed in a transaction of
their own before the rotation's begins (keys/intents.py), so that a start destroys that generation's keys only when
this rotation's process was killed before its commit, never the keys of a generation a restored backup does not
know.

After the rotation's commit, the keys its CA rows name are marked committed in the token (mark_committed_keys): the
token is the second witness, which a database backup taken between the intents' commit and the rotation's cannot roll
back (keys/deployment.py). A process stopped between that commit and the mark leaves keys the database names: the next
start completes the mark (workflows/init.py discard_unused_token_keys), and so does the token-keys background job's
next run on any replica (workflows/init.py tend_token_keys), and the next rotation that prepares a generation."""

from __future__ import annotations

import logging
import weakref
from datetime import datetime

from sqlmodel import select

from audit import Actor
from core.errors import Unavailable
from keys.intents import COMMIT_WITHIN, forget_unmade
from keys.store import MarkedKeyStore
from pki import service
from pki.ca import GenerationKeys, reserve_generation_keys
from pki.models import CertificateAuthority
from pki.rotation import prepare_due
from pki.schedule import RotationStatus
from workflows.context import AppContext

_log = logging.getLogger(__name__)


def reserve_keys(ctx: AppContext, *, force: bool) -> GenerationKeys | None:
    """The next generation's key ids, their intents committed, when the key store is a token and a rotation now
    would prepare one; else None (nothing written: a tick of the background job with nothing due writes nothing)."""
    if not isinstance(ctx.keystore, MarkedKeyStore):
        return None  # the file store never destroys a key it cannot bring back (keys/intents.py)
    with ctx.db.read_session() as session:
        if not prepare_due(session, force=force, now=ctx.clock()):
            return None
    return reserve_generation_keys(ctx.db, ctx.clock())


def release_keys(ctx: AppContext, reserved: GenerationKeys | None) -> None:
    """After a rotation that did not make the reserved keys, or rolled back: their intents go, but for a key the store
    still holds (a rollback whose destroy failed), which the next start destroys. Never raises: it runs on a failure
    path, and a row left is removed by a later start's sweep."""
    if reserved is None:
        return
    try:
        made = [k for k in reserved.ids if ctx.keystore.exists(k)]
        forget_unmade(ctx.db, reserved.ids, made)
    except Exception as exc:
        _log.warning("could not remove the key intents of generation %d (%s): %s: %s", reserved.generation,
                     ", ".join(reserved.ids), type(exc).__name__, exc)


def commit_in_time(ctx: AppContext, reserved: GenerationKeys | None, reserved_at: datetime, made: int | None) -> None:
    """Before the COMMIT of a transaction that made the `reserved` generation (`made`): Unavailable, which rolls it
    back (its keys destroyed, keys/undo.py), when its intents are COMMIT_WITHIN old. A start destroys an intent's
    uncommitted key once the intent is ABANDONED_AFTER old (a copy of this database started against the token cannot
    tell a rotation under way here from a killed one): committing later could name keys such a start destroyed."""
    if reserved is None or made != reserved.generation:
        return
    took = ctx.clock() - reserved_at
    if took >= COMMIT_WITHIN:
        raise Unavailable(f"CA generation {reserved.generation} was not committed: {int(took.total_seconds())} s "
                          f"passed since its key intents (at most {int(COMMIT_WITHIN.total_seconds())} s, so that no "
                          "start may take its keys for a killed rotation's); rolled back, its keys destroyed; the next "
                          "rotation check tries again")


def rotate_cas(ctx: AppContext, *, force: bool, actor: Actor, request_id: str | None = None) -> RotationStatus:
    """Run the CA schedule once (pki.rotation.rotate), the keys of a generation it prepares reserved first."""
    reserved_at = ctx.clock()  # (the intents' time is this or later)
    reserved = reserve_keys(ctx, force=force)
    try:
        with ctx.db.session() as session:
            status = service.rotate(session, ctx.keystore, force=force, actor=actor, clock=ctx.clock,
                                    request_id=request_id, reserved=reserved)
            commit_in_time(ctx, reserved, reserved_at, status.prepared)
    except BaseException:
        release_keys(ctx, reserved)
        raise
    if reserved is not None and status.prepared != reserved.generation:
        release_keys(ctx, reserved)  # another replica prepared it first: these ids were never made
    if status.prepared is not None and isinstance(ctx.keystore, MarkedKeyStore):
        mark_committed_keys(ctx, ctx.keystore)  # committed: the token witnesses it
    return status


# Per key store, the key ids CA rows named at a mark_committed_keys that found each marked, or marked it, or found it
# not this deployment's to mark: a mark stays until its key is destroyed, so these need no second look.
_WITNESSED: weakref.WeakKeyDictionary[MarkedKeyStore, set[str]] = weakref.WeakKeyDictionary()


def named_key_ids(ctx: AppContext) -> set[str]:
    """Every key id a committed CA row of this database names, in any state (a retired generation's keys too)."""
    named: set[str] = set()
    with ctx.db.read_session() as session:
        for key_id, jwt_key_id in session.exec(select(CertificateAuthority.key_id, CertificateAuthority.jwt_key_id)):
            named.add(key_id)
            if jwt_key_id is not None:
                named.add(jwt_key_id)
    return named


def mark_committed_keys(ctx: AppContext, keystore: MarkedKeyStore) -> list[str]:
    """Mark committed, in the token, each key of this deployment that a committed CA row names and the token does not
    say is committed yet: the keys of a rotation (or init) that just committed, of one whose process stopped between
    its commit and this mark, and the keys made before the token was a witness. The ids marked. Never raises: the
    commit it follows stands, a key the database names is never destroyed, and the next start (or the token-keys job's
    next tick, workflows/init.py tend_token_keys) tries again."""
    try:
        named = named_key_ids(ctx)  # read after the commit: only what is in the database
        seen = _WITNESSED.setdefault(keystore, set())
        if named <= seen:  # (the token-keys job's every run: no token read unless a CA row names a key not seen)
            return []
        owners = keystore.key_owners()
        # each named key of this deployment, committed or not: a process stopped between the private object's mark
        # and the public one's left a pair the token calls committed, and only mark_committed completes it
        mine = {k for k, owner in owners.items() if owner is not None}
        marked = [k for k in sorted(named & mine) if keystore.mark_committed(k)]
        seen.update(named)  # marked now, marked before, or not this deployment's to mark (unmarked, absent)
    except Exception as exc:
        _log.warning("could not mark this deployment's committed CA keys as committed in %r, tried again at the next "
                     "start: %s: %s", keystore, type(exc).__name__, exc)
        return []
    if marked:
        _log.info("marked %d CA key(s) committed in %r (the token's witness that a CA generation names them): %s",
                  len(marked), keystore, ", ".join(marked))
    return marked
