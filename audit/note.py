"""The signed checkpoint note: the external anchor of the log, in the C2SP tlog-checkpoint / signed-note format.

    <origin>\\n<tree size>\\n<base64 root hash>\\n[<extension line>\\n ...]
    \\n— <key name> <base64(key hash[4] || signature)>\\n

Two extension lines (C2SP: opaque, non-empty lines after the root, covered by the signature):

    trustfabric-time <UTC time, microseconds, Z>     when it was signed: an export cut back to an older
                                                      checkpoint shows its age, and `audit verify
                                                      --since-checkpoint` refuses one older than a kept one
    trustfabric-counters <counted_from> <keys> <base64 root>
                                                      the RFC 6962 root of every key's head (audit/counters.py)

The signature is Ed25519 over the note body (its lines with their newlines); the key hash is the
first 4 bytes of SHA-256(key name || "\\n" || 0x01 || raw public key) (note key type 0x01 = Ed25519).
The audit key lives in the KeyStore (keys/, below audit) under its own id, apart from the CA keys.

This module is the note format alone (write, parse, verify): no database, no key store, so the offline
verifier (`audit verify`) loads it without SQLAlchemy. Stored checkpoints and their writer: audit/checkpoint.py.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit import merkle
from audit.errors import CheckpointError
from audit.wire import format_ts

if TYPE_CHECKING:
    from keys import PublicKey

DEFAULT_ORIGIN = "trustfabric/audit"
SIG_PREFIX = "\u2014 "  # em dash, space
ED25519_NOTE_KEY_TYPE = b"\x01"


class CheckpointSigner(Protocol):
    """What checkpoint signing needs of a key (a keys.Signer has it; tests use a bare Ed25519 key)."""

    def sign(self, data: bytes) -> bytes:
        """Raw 64-byte Ed25519 signature over data."""
        ...

    def public_key(self) -> PublicKey:
        """The public half (an Ed25519PublicKey for the audit key)."""
        ...


def log_origin(trust_domain: str) -> str:
    """The checkpoint origin of a trust domain's audit log (C2SP: a schema-less URL naming the log)."""
    origin = f"{trust_domain}/audit"
    check_origin(origin)
    return origin


def ed25519_public_key(signer: CheckpointSigner) -> Ed25519PublicKey:
    key = signer.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise CheckpointError(f"the audit key must be Ed25519, not {type(key).__name__}")
    return key


def public_key_pem(signer: CheckpointSigner) -> str:
    """The audit public key as PEM (SubjectPublicKeyInfo), for auditors to keep outside the system."""
    return (
        ed25519_public_key(signer)
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def _b64(text: str, what: str) -> bytes:
    """Strict base64 of a note's field; CheckpointError naming it otherwise (non-ASCII text included)."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:  # binascii.Error, and b64decode's own ValueError for non-ASCII text
        raise CheckpointError(f"{what} is not base64") from exc


def load_public_key(data: bytes | str) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM, or from a signed-note verifier key `<name>+<hash>+<base64>`."""
    raw = data.encode() if isinstance(data, str) else data
    text = raw.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text)
        except ValueError as exc:
            raise CheckpointError(f"the public key is not valid PEM: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise CheckpointError(f"the audit public key must be Ed25519, not {type(key).__name__}")
        return key
    parts = text.decode(errors="replace").split("+", 2)
    # a verifier key is one line `<name>+<8 hex>+<base64>`; any other file with two `+` (an export, a README)
    # is no key at all, not a key whose material is broken
    if len(parts) == 3 and b"\n" not in text and re.fullmatch(r"[0-9a-f]{8}", parts[1]):
        blob = _b64(parts[2], "the verifier key's key material")
        if len(blob) == 33 and blob[:1] == ED25519_NOTE_KEY_TYPE:
            key = Ed25519PublicKey.from_public_bytes(blob[1:])
            if key_hash(parts[0], key).hex() != parts[1]:
                raise CheckpointError("the verifier key's hash does not match its name and key")
            return key
    raise CheckpointError("the public key is neither a PEM Ed25519 key nor a signed-note verifier key")


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_hash(name: str, key: Ed25519PublicKey) -> bytes:
    """The signed-note key id: SHA-256(name || '\\n' || 0x01 || key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519_NOTE_KEY_TYPE + _raw(key)).digest()[:4]


def verifier_key(name: str, key: Ed25519PublicKey) -> str:
    """The signed-note verifier key string `<name>+<hex key hash>+<base64(0x01 || key)>`."""
    blob = base64.b64encode(ED25519_NOTE_KEY_TYPE + _raw(key)).decode()
    return f"{name}+{key_hash(name, key).hex()}+{blob}"


def check_origin(origin: str) -> None:
    if not origin or any(c.isspace() for c in origin) or "+" in origin or not origin.isprintable():
        raise CheckpointError(f"checkpoint origin {origin!r} must be printable, without spaces or '+'")


TIME_LINE = "trustfabric-time"
COUNTERS_LINE = "trustfabric-counters"


def time_line(at: datetime) -> str:
    return f"{TIME_LINE} {format_ts(at)}"


def counters_line(counted_from: int, keys: int, root: bytes) -> str:
    return f"{COUNTERS_LINE} {counted_from} {keys} {base64.b64encode(root).decode()}"


def checkpoint_body(origin: str, size: int, root: bytes, extensions: Sequence[str] = ()) -> bytes:
    check_origin(origin)
    if size < 0 or len(root) != merkle.HASH_SIZE:
        raise CheckpointError("checkpoint needs a non-negative size and a 32-byte root")
    if any(not line or "\n" in line for line in extensions):
        raise CheckpointError("checkpoint extension lines must be non-empty single lines")
    return "".join(f"{line}\n" for line in (origin, str(size), base64.b64encode(root).decode(), *extensions)).encode()


def sign_checkpoint(
    signer: CheckpointSigner, origin: str, size: int, root: bytes, extensions: Sequence[str] = ()
) -> str:
    """The signed note text; the key name is the origin (the C2SP convention)."""
    body = checkpoint_body(origin, size, root, extensions)
    key = ed25519_public_key(signer)
    sig = signer.sign(body)
    if len(sig) != 64:
        raise CheckpointError(f"the audit key returned a {len(sig)}-byte signature; Ed25519 gives 64")
    line = SIG_PREFIX + origin + " " + base64.b64encode(key_hash(origin, key) + sig).decode()
    return body.decode() + "\n" + line + "\n"


@dataclass(frozen=True)
class CountersHead:
    """What a checkpoint signs about the per-key counters: from which position events carry them, and
    the RFC 6962 root over the heads of `keys` keys."""

    counted_from: int
    keys: int
    root: bytes


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    note: str
    time: datetime | None = None  # None: signed before checkpoints carried a time
    counters: CountersHead | None = None  # None: signed before the log kept counters


def _decimal(text: str, what: str) -> int:
    if not text.isdigit() or not text.isascii() or (text != "0" and text.startswith("0")):
        raise CheckpointError(f"checkpoint {what} {text[:30]!r} is not a decimal number")
    return int(text)


def _extensions(lines: list[str]) -> tuple[datetime | None, CountersHead | None]:
    """The extension lines this project writes; others are signed but not ours, and ignored."""
    at: datetime | None = None
    heads: CountersHead | None = None
    for line in lines:
        if not line:
            raise CheckpointError("checkpoint has an empty extension line")
        name, _, value = line.partition(" ")
        if name == TIME_LINE:
            try:
                at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                at = None
            if at is None or at.tzinfo is None or not value.endswith("Z"):
                raise CheckpointError(f"checkpoint time {value[:40]!r} is not a UTC time")
        elif name == COUNTERS_LINE:
            parts = value.split(" ")
            if len(parts) != 3:
                raise CheckpointError("checkpoint counters line needs counted_from, keys and root")
            root = _b64(parts[2], "checkpoint counters root")
            if len(root) != merkle.HASH_SIZE:
                raise CheckpointError("checkpoint counters root is not 32 bytes")
            heads = CountersHead(_decimal(parts[0], "counted_from"), _decimal(parts[1], "key count"), root)
    return at, heads


def verify_checkpoint(note: str, public_key: Ed25519PublicKey, *, origin: str | None = None) -> Checkpoint:
    """Parse a signed checkpoint and check its signature by `public_key`; CheckpointError otherwise."""
    if not note.endswith("\n") or "\n\n" not in note:
        raise CheckpointError("checkpoint is not a signed note (no blank line before the signatures)")
    body, sigs = note.split("\n\n", 1)
    body += "\n"
    lines = body.split("\n")[:-1]
    if len(lines) < 3:
        raise CheckpointError("checkpoint body needs origin, tree size and root hash lines")
    cp_origin, size_text, root_text = lines[0], lines[1], lines[2]
    if origin is not None and cp_origin != origin:
        raise CheckpointError(f"checkpoint origin is {cp_origin!r}, expected {origin!r}")
    size = _decimal(size_text, "tree size")
    root = _b64(root_text, "checkpoint root hash")
    if len(root) != merkle.HASH_SIZE:
        raise CheckpointError(f"checkpoint root hash is {len(root)} bytes, want 32")
    want = key_hash(cp_origin, public_key)
    seen_names: list[str] = []
    for line in sigs.split("\n")[:-1]:
        if not line.startswith(SIG_PREFIX):
            raise CheckpointError(f"malformed signature line {line[:60]!r}")
        name, _, b64 = line[len(SIG_PREFIX) :].rpartition(" ")
        blob = _b64(b64, "checkpoint signature")
        seen_names.append(name)
        if name != cp_origin or blob[:4] != want:
            continue
        try:
            public_key.verify(blob[4:], body.encode())
        except InvalidSignature as exc:
            raise CheckpointError(
                "checkpoint signature does not verify with the audit public key: the checkpoint was altered"
            ) from exc
        at, heads = _extensions(lines[3:])  # parsed only once the signature holds
        return Checkpoint(cp_origin, size, root, note, at, heads)
    raise CheckpointError(
        "checkpoint is not signed by the given audit public key"
        + (f" (signed by other key(s) named {', '.join(sorted(set(seen_names)))})" if seen_names else "")
    )
