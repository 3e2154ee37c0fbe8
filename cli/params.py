"""Command-line values checked while the arguments are parsed, before a command does any work: a bad one is
a usage error (exit 2) in one line naming the option, never a traceback from deep inside.

Each checker is a `Check`: it parses the text and knows a value it accepts (`good`) and one it refuses
(`bad`), so tests/cli/test_bad_arguments.py can feed every option of every command a bad value (with good
ones for the rest) without a table kept beside the commands. Use one as
`typer.Option(..., parser=PORT, metavar=PORT.metavar)`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import typer

from core.errors import InvalidInput


class Check:
    """A parser for one kind of command-line value; `good` and `bad` are values it accepts and refuses."""

    def __init__(self, parse: Callable[[str], Any], *, good: str, bad: str, metavar: str) -> None:
        self._parse = parse
        self.good = good
        self.bad = bad
        self.metavar = metavar
        self.__name__ = metavar.lower()

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str):  # a default already parsed, or typer passing one through
            return value
        try:
            return self._parse(value)
        except (InvalidInput, ValueError) as exc:
            raise typer.BadParameter(str(exc)) from None


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidInput(f"{text!r} is not a port number (1-65535)")
    return int(text)


def _url(text: str) -> str:
    """An http(s) URL with a host (and a port in range); the trailing slash dropped."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        hint = f"http://{text}" if "://" not in text else "http://127.0.0.1:8443"
        raise InvalidInput(f"{text!r} is not an http:// or https:// URL (e.g. {hint})")
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"{text!r}: the port is not a number from 1 to 65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise InvalidInput(f"{text!r}: the port is not a number from 1 to 65535")
    if not parts.hostname:
        raise InvalidInput(f"{text!r} names no host")
    return text.strip().rstrip("/")


def _slug(text: str) -> str:
    from core.slugs import require_slug

    return require_slug(text, "name")


def _trust_domain(text: str) -> str:
    from pki.errors import InvalidSpiffeId
    from pki.spiffe_id import validate_trust_domain

    try:
        return validate_trust_domain(text)
    except InvalidSpiffeId as exc:
        raise InvalidInput(str(exc)) from None


def _tenant_group(text: str) -> tuple[str, str]:
    tenant, sep, group = text.partition("/")
    if not sep or not tenant or not group:
        raise InvalidInput(f"{text!r} is not TENANT/GROUP (e.g. globex/api)")
    return _slug(tenant), _slug(group)


def _proto_port(text: str) -> dict[str, object]:
    proto, sep, number = text.partition("/")
    if not sep or proto not in ("tcp", "udp"):
        raise InvalidInput(f"{text!r} is not PROTO/PORT (e.g. tcp/443)")
    return {"proto": proto, "port": _port(number)}


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidInput(f"{text!r} is not KEY=VALUE")
    return key, value


def _ttl(text: str) -> timedelta:
    from core.clock import parse_ttl

    return parse_ttl(text)


def _when(text: str) -> datetime:
    from core.clock import parse_when

    try:
        return parse_when(text, "time")
    except InvalidInput:
        raise InvalidInput(f"{text!r} is not an ISO 8601 time with a timezone (e.g. 2026-01-01T00:00:00Z)") from None


def _seconds(text: str) -> int:
    if not text.strip().isdigit() or int(text) <= 0:
        raise InvalidInput(f"{text!r} is not a positive number of seconds")
    return int(text)


def choice(*values: str) -> Check:
    """One of `values`; the error lists them."""

    def parse(text: str) -> str:
        if text not in values:
            raise InvalidInput(f"{text!r} is not one of {', '.join(values)}")
        return text

    return Check(parse, good=values[0], bad="nope", metavar="|".join(values) if len(values) <= 6 else "CHOICE")


PORT = Check(_port, good="8443", bad="99999", metavar="PORT")
URL = Check(_url, good="http://127.0.0.1:1", bad="127.0.0.1:8443", metavar="URL")
SLUG = Check(_slug, good="acme", bad="Not_A_Slug", metavar="NAME")
TRUST_DOMAIN = Check(_trust_domain, good="example.org", bad="Example.ORG/path", metavar="DOMAIN")
TENANT_GROUP = Check(_tenant_group, good="acme/web", bad="globex", metavar="TENANT/GROUP")
PROTO_PORT = Check(_proto_port, good="tcp/443", bad="tcp/99999", metavar="PROTO/PORT")
LABEL = Check(_label, good="tier=gpu", bad="no-equals-sign", metavar="KEY=VALUE")
TTL = Check(_ttl, good="1h", bad="soon", metavar="TTL")
WHEN = Check(_when, good="2026-01-01T00:00:00Z", bad="yesterday", metavar="TIME")
SECONDS = Check(_seconds, good="60", bad="-5", metavar="SECONDS")
PROTO = choice("tcp", "udp")


def existing_file(**kw: Any) -> dict[str, Any]:
    """typer.Option/Argument keywords for a file that must exist (a folder is refused)."""
    return {"exists": True, "file_okay": True, "dir_okay": False, "readable": True, **kw}


def existing_dir(**kw: Any) -> dict[str, Any]:
    """typer.Option/Argument keywords for a folder that must exist (a file is refused)."""
    return {"exists": True, "file_okay": False, "dir_okay": True, "readable": True, **kw}
