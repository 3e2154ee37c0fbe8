"""Canonical JSON (RFC 8785 JCS) for everything hashed or signed."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes: sorted keys, no whitespace, UTF-8, ECMAScript number form."""
    return bytes(rfc8785.dumps(value))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    """SHA-256 over the canonical form, hex; equal values hash equal whatever their key order."""
    return sha256_hex(canonical_json(value))
