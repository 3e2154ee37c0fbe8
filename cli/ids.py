"""Ids given back as unique prefixes (like git's short hashes): a command that takes an id also takes any prefix
of it that names exactly one object it can see; a prefix that names none or several fails in one line naming the
candidates. A table whose whole ids do not leave its other columns room on the terminal prints such ids as
prefixes unique within it (`unique_prefix_length`, git's --abbrev); `-o wide` prints them whole."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import pairwise

from core.errors import InvalidInput, NotFound

MIN_PREFIX = 4
SHOWN_CANDIDATES = 5
MIN_SHOWN = 8  # a shortened id in a table: never fewer characters (git shows 7 hex digits)


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
