"""Audit errors: one specific, typed error with a message a person can act on."""

from __future__ import annotations

from core.errors import InvalidInput, NotFound, TrustfabricError


class AuditError(TrustfabricError):
    """Base of the audit package's errors."""

    http_status = 400  # proofs for sizes the log does not hold, checkpoints that do not parse


class InvalidAuditEvent(InvalidInput):
    """record() was given a malformed event; nothing was written."""


class ProofError(AuditError):
    """A Merkle inclusion or consistency proof does not verify, or cannot be built for those sizes."""


class CheckpointError(AuditError):
    """A signed checkpoint is malformed, or not signed by the audit key."""


class AuditKeyMissing(NotFound):
    """The audit signing key is not in the KeyStore; run ensure_audit_key() at init."""


class VerificationError(AuditError):
    """An export failed offline verification: `kind` names what is wrong, `index` the first bad event.

    `index` is the event's sequence number (its leaf index), or None when the problem is not one event
    (the checkpoint, the header, the file as a whole).
    """

    def __init__(self, kind: str, message: str, index: int | None = None, line: int | None = None) -> None:
        where = f"event {index}: " if index is not None else ""
        super().__init__(f"{where}{message}")
        self.kind = kind
        self.index = index
        self.line = line
