"""Tenant and group identifiers are DNS labels, so they can appear in SPIFFE IDs, VRF names and NVUE keys."""

from __future__ import annotations

import re

from core.errors import InvalidInput
from core.vocabulary import SLUG_PATTERN

SLUG_RE = re.compile(SLUG_PATTERN)


def is_slug(value: str) -> bool:
    return bool(SLUG_RE.fullmatch(value))


def require_slug(value: str, what: str) -> str:
    """The value, or InvalidInput naming the field and the rule."""
    if not is_slug(value):
        raise InvalidInput(
            f"{what} {value!r} is not a DNS label (lowercase letters, digits and '-', 1-63 chars, "
            "no leading or trailing '-')"
        )
    return value
