"""Ids given back as unique prefixes (like git's short hashes): a command that takes an id also takes any prefix
of it that names exactly one object it can see; a prefix that names none or several fails in one line naming the
candidates. A table whose whole ids do not leave its other columns room on the terminal prints such ids as
prefixes unique within it (`unique_prefix_length`, git's --abbrev); `-o wide` prints them whole."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from itertools import pairwise

from core.errors import InvalidInput, NotFound

MIN_PREFIX = 4
SHOWN_CANDIDATES = 5
MIN_SHOWN = 8  # a shortened id in a table: never fewer characters (git shows 7 hex digits)


# what a whole id, or a prefix of one, can look like: anything else names no object at all (a malformed argument,
# exit 2), where an id of that shape that names none is not found (a failure, exit 1)
GRANT_ID_SHAPE = re.compile(r"g(?:-(?:[0-9a-f]{0,11}|[0-9a-f]{12}(?:-[0-9a-f]{0,16})?))?")  # g-<12 hex>-<16 hex>
TOKEN_ID_SHAPE = re.compile(r"[0-9a-f]{1,32}")  # a JWT's jti (32 hex digits), a bootstrap token's (16)


def id_or_prefix(given: str, shape: re.Pattern[str], noun: str, example: str) -> str:
    """`given` when it is an id of `shape` or a prefix of one long enough to look up (MIN_PREFIX); InvalidInput
    otherwise, before anything is asked: what the command line got wrong, whatever exists."""
    if not shape.fullmatch(given):
        raise InvalidInput(f"{given!r} is not a {noun} id nor the start of one (e.g. {example})")
    if len(given) < MIN_PREFIX:
        raise InvalidInput(f"{noun} id prefix {given!r} is too short: give at least {MIN_PREFIX} characters")
    return given


def resolve(given: str, known: Iterable[str], noun: str) -> str:
    """The one id in `known` equal to or starting with `given`."""
    ids = list(dict.fromkeys(known))
    if given in ids:
        return given
    if len(given) < MIN_PREFIX:
        raise InvalidInput(f"{noun} id prefix {given!r} is too short: give at least {MIN_PREFIX} characters")
    matches = [i for i in ids if i.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotFound(f"no {noun} id starts with {given!r}")
    shown = ", ".join(sorted(matches)[:SHOWN_CANDIDATES])
    more = f" and {len(matches) - SHOWN_CANDIDATES} more" if len(matches) > SHOWN_CANDIDATES else ""
    raise InvalidInput(f"{noun} id prefix {given!r} is ambiguous: {shown}{more}")


def resolve_lazily(given: str, is_full: Callable[[str], bool], known: Callable[[], Iterable[str]], noun: str) -> str:
    """`given` as is when it has the shape of a whole id (no listing needed), else resolved among `known()`."""
    return given if is_full(given) else resolve(given, known(), noun)


def unique_prefix_length(ids: Iterable[str], least: int = MIN_SHOWN) -> int:
    """The one length (at least `least`) at which no two different ids share their prefix: each printed that long
    names exactly one id of the list (an id no longer than it is printed whole)."""
    distinct = sorted(set(ids))
    need = max(least, MIN_PREFIX)
    for a, b in pairwise(distinct):
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        need = max(need, common + 1)
    return need
