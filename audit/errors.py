"""Audit errors: one specific, typed error with a message a person can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import InvalidInput, NotFound, TrustfabricError

if TYPE_CHECKING:
    from audit.verify.report import VerifyReport


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
    (the checkpoint, the header, the file as a whole); `line` the line of the file where it was seen.
    Each kind is a subclass, so a caller can catch exactly one.
    """

    kind = "failed"

    def __init__(self, message: str, index: int | None = None, line: int | None = None) -> None:
        where = f"event {index}: " if index is not None else ""
        super().__init__(f"{where}{message}")
        self.index = index
        self.line = line


class Modified(VerificationError):
    kind = "modified"


class Removed(VerificationError):
    kind = "removed"


class Reordered(VerificationError):
    kind = "reordered"


class Inserted(VerificationError):
    kind = "inserted"


class Truncated(VerificationError):
    kind = "truncated"


class ChainBroken(VerificationError):
    kind = "chain_broken"


class OutsideFilter(VerificationError):
    kind = "outside_filter"


class Malformed(VerificationError):
    kind = "malformed"


class BadCheckpoint(VerificationError):
    kind = "checkpoint"


class BadHeader(VerificationError):
    kind = "header"


class RootMismatch(VerificationError):
    kind = "root_mismatch"


class TimeReversed(VerificationError):
    """An event's time is earlier than an event before it (events are appended in time order)."""

    kind = "time_reversed"


class Oversized(VerificationError):
    """A line longer than any export writes; verification stops there instead of reading it whole."""

    kind = "oversized"


class StaleCheckpoint(VerificationError):
    """The export's checkpoint is older than one the auditor kept: an old export passed as current."""

    kind = "stale"


class Inconsistent(VerificationError):
    """The export's tree does not extend the kept checkpoint's tree: the log was rewritten (forked)."""

    kind = "inconsistent"


class Unproven(VerificationError):
    """Nothing was found altered, but the export cannot prove that its selection is complete (its filter
    needs per-key counters that older events or checkpoints lack): never reported as OK. `report` holds
    what was verified."""

    kind = "unproven"

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message)
        self.report = report
