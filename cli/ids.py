"""Ids given back as unique prefixes (like git's short hashes): tables print ids whole, and a command
that takes an id also takes any prefix of it that names exactly one object it can see; a prefix that
names none or several fails in one line naming the candidates."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from core.errors import InvalidInput, NotFound

MIN_PREFIX = 4
SHOWN_CANDIDATES = 5


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
