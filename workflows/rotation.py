"""A CA rotation as a server runs it (the background job, `POST /ca/rotate`, `trustfabric ca rotate`): in a PKCS#11
token, the key ids of a generation it will prepare are reserved first, their intents committed in a transaction of
their own before the rotation's begins (keys/intents.py), so that a start destroys that generation's keys only when
this rotation's process was killed before its commit, never the keys of a generation a restored backup does not
know."""

from __future__ import annotations

import logging

from audit import Actor
from keys.intents import forget_unmade
from keys.store import MarkedKeyStore
from pki import service
from pki.ca import GenerationKeys, reserve_generation_keys
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


def rotate_cas(ctx: AppContext, *, force: bool, actor: Actor, request_id: str | None = None) -> RotationStatus:
    """Run the CA schedule once (pki.rotation.rotate), the keys of a generation it prepares reserved first."""
    reserved = reserve_keys(ctx, force=force)
    try:
        with ctx.db.session() as session:
            status = service.rotate(session, ctx.keystore, force=force, actor=actor, clock=ctx.clock,
                                    request_id=request_id, reserved=reserved)
    except BaseException:
        release_keys(ctx, reserved)
        raise
    if reserved is not None and status.prepared != reserved.generation:
        release_keys(ctx, reserved)  # another replica prepared it first: these ids were never made
    return status
