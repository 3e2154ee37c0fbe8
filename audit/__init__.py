"""Append-only, tamper-evident audit log. `record` (or `record_only`, which returns nothing) is the only way to append.

Events are leaves of an RFC 6962 Merkle tree; signed checkpoints (C2SP signed notes, Ed25519 audit
key from the KeyStore) anchor it; exports carry what an auditor needs to verify them offline.

The names below load on first use (core/lazy.py): the offline verifier (audit/verify/) imports this package
and must not pay for the database code of the service and the checkpoint writer.
"""

from typing import TYPE_CHECKING

from core.lazy import lazy_exports

if TYPE_CHECKING:
    from audit.actor import Actor
    from audit.checkpoint import (
        AUDIT_KEY_ID,
        DEFAULT_ORIGIN,
        CheckpointWriter,
        audit_signer,
        ensure_audit_key,
        public_key_pem,
        write_checkpoint,
    )
    from audit.service import consistency_proof, inclusion_proof, record, record_only, root_at, tree_size

__all__ = [
    "AUDIT_KEY_ID",
    "DEFAULT_ORIGIN",
    "Actor",
    "CheckpointWriter",
    "audit_signer",
    "consistency_proof",
    "ensure_audit_key",
    "inclusion_proof",
    "public_key_pem",
    "record",
    "record_only",
    "root_at",
    "tree_size",
    "write_checkpoint",
]

__getattr__ = lazy_exports(__name__, {
    "Actor": "audit.actor",
    **dict.fromkeys(("AUDIT_KEY_ID", "DEFAULT_ORIGIN", "CheckpointWriter", "audit_signer", "ensure_audit_key",
                     "public_key_pem", "write_checkpoint"), "audit.checkpoint"),
    **dict.fromkeys(("consistency_proof", "inclusion_proof", "record", "record_only", "root_at", "tree_size"),
                    "audit.service"),
})
