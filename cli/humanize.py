"""Values as a person reads them: local times, relative durations, lists and mappings without Python's
reprs (`None`, `True`, `{'proto': 'tcp'}`, `datetime.datetime(...)` never reach a terminal).

Only the human output goes through here; --json and --output yaml print the API's values unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

EMPTY = "-"
# What a terminal acts on instead of showing: C0 and C1 controls (ESC and CSI sequences retitle, clear, hide text and
# write hyperlinks; CR and newline start another line), and the bidirectional overrides, isolates and line separators
# that reorder or break what follows.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")


def parse_time(value: Any) -> datetime | None:
    """The moment `value` names (a datetime or an ISO 8601 string), as aware UTC; None if it names none.
    A time without a zone is taken as UTC: that is how the API and the database store them."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and _ISO_RE.match(value):
        try:
            moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def local_time(value: Any, *, seconds: bool = True, zone: bool = True) -> str:
    """`2026-11-30 07:36:12 CET`: the machine's local zone (TZ), to the second (or the minute); without the
    zone's name for a table whose header names it."""
    moment = parse_time(value)
    if moment is None:
        return text(value)
    fmt = "%Y-%m-%d %H:%M" + (":%S" if seconds else "") + (" %Z" if zone else "")
    return moment.astimezone().strftime(fmt).strip()


def zone_name() -> str:
    """The local zone's abbreviation now (`CET`, `UTC`), for a table header."""
    return datetime.now().astimezone().strftime("%Z") or "local"


def duration(delta: timedelta) -> str:
    """`2d 3h`, `1h 5m`, `42s`: the two largest units, for people."""
    total = int(abs(delta.total_seconds()))
    if total < 60:
        return f"{total}s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def relative(value: Any, now: datetime | None = None) -> str:
    """`in 1h 59m` or `3d 2h ago`; '' when `value` is no time."""
    moment = parse_time(value)
    if moment is None:
        return ""
    delta = moment - (now or datetime.now(UTC))
    if abs(delta) < timedelta(seconds=1):
        return "now"
    return f"in {duration(delta)}" if delta > timedelta(0) else f"{duration(delta)} ago"


def when(value: Any, now: datetime | None = None) -> str:
    """Local time with the distance from now: `2026-11-30 09:36:12 CET (in 2h)`."""
    if parse_time(value) is None:
        return text(value)
    return f"{local_time(value)} ({relative(value, now)})"


def _port(item: Mapping[str, Any]) -> str | None:
    if set(item) == {"proto", "port"}:
        return f"{item['proto']}/{item['port']}"
    return None


def printable(value: str) -> str:
    """Text another principal may have chosen (a justification, a reason, a comment), as a terminal shows it: each
    character it would act on instead written as its escape (`\\x1b`, `\\n`, `\\u202e`); anything else unchanged."""
    return _UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)


def text(value: Any) -> str:
    """One value on one line: None is '-', booleans yes/no, times local, lists comma-joined, mappings
    `key=value`, `tcp/443` for a port."""
    if value is None:
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime) or (isinstance(value, str) and parse_time(value) is not None):
        return local_time(value)
    if isinstance(value, str):
        return printable(value) if value else EMPTY
    if isinstance(value, Mapping):
        port = _port(value)
        if port is not None:
            return port
        return ", ".join(f"{k}={text(v)}" for k, v in value.items()) if value else EMPTY
    if isinstance(value, Sequence | set | frozenset):
        items = [text(v) for v in value]
        sep = "; " if any(isinstance(v, Mapping) and _port(v) is None for v in value) else ", "
        return sep.join(items) if items else EMPTY
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def label(key: str) -> str:
    """`expires_at` -> `expires at`."""
    return key.replace("_", " ")


def field_lines(data: Mapping[str, Any], indent: str = "") -> list[str]:
    """`key: value` lines for a mapping; nested mappings and lists of mappings indent under their key,
    times show their distance from now."""
    lines: list[str] = []
    for key, value in data.items():
        name = f"{indent}{label(str(key))}"
        if isinstance(value, Mapping) and value and _port(value) is None:
            lines.append(f"{name}:")
            lines.extend(field_lines(value, indent + "  "))
        elif (isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value)
              and any(_port(v) is None for v in value)):
            lines.append(f"{name}:")
            for item in value:
                lines.append(f"{indent}  - {text(item)}")
        elif parse_time(value) is not None:
            lines.append(f"{name}: {when(value)}")
        else:
            lines.append(f"{name}: {text(value)}")
    return lines
