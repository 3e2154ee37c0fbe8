"""Workload-attestation selectors, SPIRE style (`unix:uid:1001`): a placed workload gets its SVID from its
node agent over the SPIFFE Workload API only when the calling process matches every selector of its
placement (what the agent reads with SO_PEERCRED and /proc), like a SPIRE registration entry parented to
that node. Validated here, once, for the fabric file, the API and the node agent."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pki.errors import InvalidSelector

MAX_SELECTORS = 16
_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")  # a POSIX user/group name
_CHECKS: dict[str, tuple[str, re.Pattern[str]]] = {
    "uid": ("a numeric user id", re.compile(r"^(0|[1-9][0-9]{0,9})$")),
    "gid": ("a numeric group id", re.compile(r"^(0|[1-9][0-9]{0,9})$")),
    "user": ("a user name", _NAME),
    "group": ("a group name", _NAME),
    "path": ("an absolute executable path", re.compile(r"^/[^\x00-\x1f]{0,1023}$")),
    "sha256": ("the executable's SHA-256 (64 hex digits)", re.compile(r"^[0-9a-f]{64}$")),
}


def parse_selector(text: str) -> tuple[str, str, str]:
    """(type, key, value) of `unix:<key>:<value>`; InvalidSelector saying what is accepted."""
    kind, sep, rest = str(text).partition(":")
    key, sep2, value = rest.partition(":")
    if kind != "unix" or not sep or not sep2:
        raise InvalidSelector(f"selector {text!r} must be unix:<{'|'.join(_CHECKS)}>:<value>")
    check = _CHECKS.get(key)
    if check is None:
        raise InvalidSelector(f"selector {text!r}: unknown unix selector {key!r} (one of {', '.join(_CHECKS)})")
    what, pattern = check
    if not pattern.fullmatch(value) or (key in ("uid", "gid") and int(value) > 4_294_967_295):
        raise InvalidSelector(f"selector {text!r}: the value must be {what}")
    return kind, key, value


def normalize_selectors(selectors: Iterable[str]) -> tuple[str, ...]:
    """Sorted, de-duplicated, each validated; at most MAX_SELECTORS."""
    out = sorted({":".join(parse_selector(s)) for s in selectors})
    if len(out) > MAX_SELECTORS:
        raise InvalidSelector(f"at most {MAX_SELECTORS} selectors per placement, got {len(out)}")
    return tuple(out)
