"""Stored checkpoints: signing the log's head into a checkpoint (the note format: audit/note.py), the audit key
that signs them, and the background writer that keeps one recent.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlmodel import Session, col, func, select

from audit import counters, merkle
from audit.errors import AuditKeyMissing, CheckpointError
from audit.models import HEAD_ID, AuditCheckpoint, AuditCounter, AuditHead
from audit.note import DEFAULT_ORIGIN as DEFAULT_ORIGIN
from audit.note import Checkpoint as Checkpoint
from audit.note import CheckpointSigner as CheckpointSigner
from audit.note import check_origin, counters_line, time_line
from audit.note import ed25519_public_key as ed25519_public_key
from audit.note import load_public_key as load_public_key
from audit.note import log_origin as log_origin
from audit.note import public_key_pem as public_key_pem
from audit.note import sign_checkpoint as sign_checkpoint
from audit.note import verifier_key as verifier_key
from audit.note import verify_checkpoint as verify_checkpoint
from core.clock import Clock, as_utc, system_clock
from keys import KeyKind, KeyStore
from store.db import Database, log_failure

_log = logging.getLogger(__name__)
AUDIT_KEY_ID = "audit-checkpoint"


def ensure_audit_key(keystore: KeyStore) -> None:
    """Create the Ed25519 audit key under AUDIT_KEY_ID unless it exists; an existing key is kept."""
    if not keystore.exists(AUDIT_KEY_ID):
        try:
            keystore.generate(AUDIT_KEY_ID, KeyKind.ED25519)
        except Exception:
            if not keystore.exists(AUDIT_KEY_ID):  # lost a race to another process: fine
                raise
    ed25519_public_key(audit_signer(keystore))


def audit_signer(keystore: KeyStore) -> CheckpointSigner:
    """The audit key, or AuditKeyMissing."""
    if not keystore.exists(AUDIT_KEY_ID):
        raise AuditKeyMissing(f"no audit key {AUDIT_KEY_ID!r} in the key store; run `trustfabric init` first")
    signer: CheckpointSigner = keystore.get(AUDIT_KEY_ID)
    return signer


# --- stored checkpoints ------------------------------------------------------------------------------


def latest_checkpoint(session: Session) -> AuditCheckpoint | None:
    return session.exec(select(AuditCheckpoint).order_by(col(AuditCheckpoint.size).desc()).limit(1)).first()


def checkpoint_of_size(session: Session, size: int) -> AuditCheckpoint | None:
    """The stored checkpoint of exactly this tree size, if one was signed."""
    return session.exec(select(AuditCheckpoint).where(AuditCheckpoint.size == size)).first()


def write_checkpoint(
    db: Database, signer: CheckpointSigner, *, origin: str = DEFAULT_ORIGIN, clock: Clock = system_clock
) -> AuditCheckpoint:
    """Sign and store a checkpoint of the log as it is now (or return the stored one of that size)."""
    return checkpoint_proving(db, signer, None, origin=origin, clock=clock)[0]


def checkpoint_proving(
    db: Database,
    signer: CheckpointSigner,
    key: str | None,
    *,
    origin: str = DEFAULT_ORIGIN,
    clock: Clock = system_clock,
) -> tuple[AuditCheckpoint, dict[str, object] | None]:
    """write_checkpoint, and with `key` the proof of that counter key's head in it (audit/counters.py),
    read under the same head lock, so proof and checkpoint describe one state of the log. The proof is
    None when the checkpoint of this size signs no counters (one signed before the log kept them)."""
    with db.session() as session:
        head = session.exec(select(AuditHead).where(AuditHead.id == HEAD_ID).with_for_update()).one()
        size = head.size
        root = merkle.fold([bytes.fromhex(h) for h in head.frontier])
        cp = session.exec(select(AuditCheckpoint).where(AuditCheckpoint.size == size)).first()
        if cp is not None and key is None:  # one checkpoint per tree size: the first one signed stands
            return cp, None
        heads = [counters.Head(c.key, c.count, c.last_leaf) for c in session.exec(select(AuditCounter)).all()]
        signed_heads = counters_line(head.counted_from or 0, len(heads), counters.heads_root(heads))
        if cp is None:
            now = clock()
            extensions = [time_line(now), signed_heads]
            cp = AuditCheckpoint(
                size=size,
                root_hash=root.hex(),
                origin=origin,
                key_name=origin,
                note=sign_checkpoint(signer, origin, size, root, extensions),
                created_at=now,
            )
            session.add(cp)
        # A checkpoint signed before the log kept counters signs other heads (none): no proof then.
        proof = counters.prove(heads, key) if key is not None and signed_heads in cp.note.split("\n") else None
    return cp, proof


class CheckpointWriter:
    """Writes a checkpoint once `every_events` new events exist, or `every_seconds` after the last one
    when anything was appended since. Call `maybe_write()` after commits, or `start()` a thread."""

    def __init__(
        self,
        db: Database,
        signer: CheckpointSigner,
        *,
        origin: str = DEFAULT_ORIGIN,
        every_events: int = 1000,
        every_seconds: float = 60.0,
        clock: Clock = system_clock,
    ) -> None:
        if every_events < 1 or every_seconds <= 0:
            raise CheckpointError("checkpoint interval must be at least 1 event and more than 0 seconds")
        check_origin(origin)
        self.db, self.signer, self.origin, self.clock = db, signer, origin, clock
        self.every_events, self.every_seconds = every_events, every_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        with self.db.read_session() as session:
            size = session.exec(select(AuditHead.size).where(AuditHead.id == HEAD_ID)).one()
            last = session.exec(
                select(AuditCheckpoint.size, AuditCheckpoint.created_at)
                .order_by(col(AuditCheckpoint.size).desc())
                .limit(1)
            ).first()
        if last is None:
            return size > 0
        last_size, last_at = last
        if size <= last_size:
            return False
        return size - last_size >= self.every_events or self.clock() - as_utc(last_at) >= timedelta(
            seconds=self.every_seconds
        )

    def maybe_write(self) -> AuditCheckpoint | None:
        return write_checkpoint(self.db, self.signer, origin=self.origin, clock=self.clock) if self.due() else None

    def start(self, poll_seconds: float = 1.0) -> None:
        def _loop() -> None:
            while not self._stop.wait(poll_seconds):
                try:
                    self.maybe_write()
                except Exception:  # keep writing later; the next export writes one anyway
                    log_failure(_log, "audit checkpoint write failed")

        self._thread = threading.Thread(target=_loop, name="audit-checkpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def checkpoint_count(session: Session) -> int:
    return int(session.exec(select(func.count()).select_from(AuditCheckpoint)).one())
