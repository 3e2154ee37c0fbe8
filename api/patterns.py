"""Every pattern a request's field is checked against, and what it means in words: a refused value is answered
"tenant must be 1-63 lowercase letters, ..." (api/errors.py, and the console's error page), never the regular
expression. A route module takes its pattern from here, so a new one comes with its words
(tests/api/test_validation_words.py finds every pattern in the OpenAPI document in PATTERN_WORDS)."""

from __future__ import annotations

from core.vocabulary import AUDIT_ACTION_PATTERN, GRANT_STATE_PATTERN, GRANT_STATES, SLUG_PATTERN
from enforcer.service import DEVICE_PATTERN

IDEMPOTENCY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
SERIAL_PATTERN = r"^(0x)?[0-9A-Fa-f:]+$"
HEX_PATTERN = r"^[0-9a-f]+$"
CONTENT_HASH_PATTERN = "^[0-9a-f]{64}$"
FABRIC_NAME_PATTERN = r"^\S+$"
FABRIC_END_PATTERN = r"^[^\s:]+:[^\s:]+$"
SENSITIVITY_PATTERN = "^(normal|sensitive)$"

_LABEL = "1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"

# pattern -> what a value must be, said after the field's name ("tenant must be ...")
PATTERN_WORDS: dict[str, str] = {
    SLUG_PATTERN: f"must be {_LABEL}",
    AUDIT_ACTION_PATTERN: "must be an action such as 'svid.issue': lowercase words (letters, digits, '_', '-') "
                          "joined by '.'",
    GRANT_STATE_PATTERN: f"must be one of: {', '.join(GRANT_STATES)}",
    IDEMPOTENCY_PATTERN: "must be 1-128 letters, digits, '.', '_', ':' or '-'",
    SERIAL_PATTERN: "must be a certificate serial number in hexadecimal (digits, a-f, ':' between bytes allowed, "
                    "optionally 0x first)",
    HEX_PATTERN: "must be a version number or a content-hash prefix: digits and lowercase a-f only",
    CONTENT_HASH_PATTERN: "must be a SHA-256 hash: 64 lowercase hexadecimal digits",
    FABRIC_NAME_PATTERN: "must not contain spaces",
    FABRIC_END_PATTERN: "must be a device and one of its ports as 'device:port' (e.g. leaf1:swp1), no spaces",
    SENSITIVITY_PATTERN: "must be 'normal' or 'sensitive'",
    DEVICE_PATTERN: f"must be 'nic:<name>' or 'leaf:<name>', the name {_LABEL}",
}


def pattern_words(field: str, pattern: str) -> str | None:
    """'tenant must be ...' for a value of `field` that `pattern` refused; None for a pattern not in the table."""
    words = PATTERN_WORDS.get(pattern)
    return f"{field} {words}" if words is not None else None
