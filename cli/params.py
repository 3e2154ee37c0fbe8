"""Command-line values checked while the arguments are parsed, before a command does any work: a bad one is
a usage error (exit 2) in one line naming the option, never a traceback from deep inside.

Each checker is a `Check`: it parses the text and knows a value it accepts (`good`) and one it refuses
(`bad`), so tests/cli/test_bad_arguments.py can feed every option of every command a bad value (with good
ones for the rest) without a table kept beside the commands. Use one as
`typer.Option(..., parser=PORT, metavar=PORT.metavar)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

from core.digits import is_digits
from core.errors import InvalidInput


class Check:
    """A parser for one kind of command-line value; `good` and `bad` are values it accepts and refuses."""

    def __init__(self, parse: Callable[[str], Any], *, good: str, bad: str, metavar: str) -> None:
        self._parse = parse
        self.good = good
        self.bad = bad
        self.metavar = metavar
        self.__name__ = metavar.lower()

    def parse(self, text: str) -> Any:
        """The parsed value, or InvalidInput (a value from elsewhere than the command line: the caller says whose)."""
        try:
            return self._parse(text)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str):  # a default already parsed, or typer passing one through
            return value
        try:
            return self._parse(value)
        except (InvalidInput, ValueError) as exc:
            raise typer.BadParameter(str(exc)) from None


def _port(text: str) -> int:
    if not is_digits(text.strip()) or not 1 <= int(text) <= 65535:
        raise InvalidInput(f"{text!r} is not a port number (1-65535)")
    return int(text)


def redacted(url: str) -> str:
    """`url` with any `user:pass@` shown as `***@`: a server URL is printed in errors, hints and `status`, and
    its userinfo may be a password (the client never sends it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # `user:pass@host:8443`, typed without its scheme
        scheme, rest = "", url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    return url if at < 0 else f"{scheme}{sep}***@{rest[at + 1:]}"


def _url(text: str) -> str:
    """An http(s) URL with a host (and a port in range); the trailing slash dropped."""
    parts = urlsplit(text.strip())
    shown = redacted(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        hint = f"http://{shown}" if "://" not in text else "http://127.0.0.1:8443"
        raise InvalidInput(f"{shown!r} is not an http:// or https:// URL (e.g. {hint})")
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"{shown!r}: the port is not a number from 1 to 65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise InvalidInput(f"{shown!r}: the port is not a number from 1 to 65535")
    if not parts.hostname:
        raise InvalidInput(f"{shown!r} names no host")
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


def _action(text: str) -> str:
    import re

    from core.vocabulary import AUDIT_ACTION_PATTERN

    if not re.fullmatch(AUDIT_ACTION_PATTERN, text):
        raise InvalidInput(f"{text!r} is not an action like 'svid.issue'")
    return text


def _identity(text: str) -> str:
    """A SPIFFE ID of the project's layout or TENANT/GROUP, kept as given (the policy service reads it)."""
    from policy.decide import parse_identity

    parse_identity(text)
    return text


def _proto_port(text: str) -> dict[str, object]:
    proto, sep, number = text.partition("/")
    if not sep or proto not in ("tcp", "udp"):
        raise InvalidInput(f"{text!r} is not PROTO/PORT (e.g. tcp/443)")
    return {"proto": proto, "port": _port(number)}


def _port_maybe_proto(text: str) -> tuple[str | None, int]:
    """`8443`, or `udp/4791` as groups and grants print ports (the protocol then checked against --proto by
    `one_protocol`)."""
    proto, sep, number = text.strip().partition("/")
    if not sep:
        return None, _port(text)
    if proto not in ("tcp", "udp"):
        raise InvalidInput(f"{text!r} is neither a port number nor PROTO/PORT (e.g. 8443, udp/4791)")
    return proto, _port(number)


def one_protocol(ports: Sequence[tuple[str | None, int]], proto: str | None) -> tuple[str, list[int]]:
    """The one protocol (--proto, or the one the ports name, else tcp) and the port numbers of a flow given as
    `--port 4791 --proto udp` or `--port udp/4791`; typer.BadParameter (exit 2, one line) when they disagree."""
    named = {p for p, _ in ports if p is not None} | ({proto} if proto else set())
    if len(named) > 1:
        from typer._click.globals import get_current_context

        given = " ".join([f"--port {p}/{n}" for p, n in ports if p is not None] + ([f"--proto {proto}"] if proto
                                                                                     else []))
        raise typer.BadParameter(f"{given}: one flow has one protocol (tcp or udp)",
                                 ctx=get_current_context(silent=True), param_hint="'--port' / '--proto'")
    return (named.pop() if named else "tcp"), [n for _, n in ports]


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InvalidInput(f"{text!r} is not KEY=VALUE")
    return key, value


def _ttl(text: str) -> timedelta:
    from core.clock import parse_ttl

    return parse_ttl(text)


def ttl_at_most(limit: timedelta) -> Check:
    """A TTL as every --ttl takes it (`90s`, `15m`, `12h`, `7d`, or plain seconds), no longer than `limit`."""
    from cli.humanize import duration

    def parse(text: str) -> timedelta:
        ttl = _ttl(text)
        if ttl > limit:
            raise InvalidInput(f"{text!r} is longer than {duration(limit)}, the most it may be")
        return ttl

    return Check(parse, good="1h", bad="soon", metavar="TTL")


_AGO = re.compile(r"^\s*(\d{1,9})([smhd])\s*$")


def _when(text: str) -> datetime:
    """An ISO 8601 time with its zone, or a time that long ago: `--since 1h` as `kubectl logs --since=1h` and
    journalctl read it (a unit is required: a bare number could be a year)."""
    from core.clock import parse_ttl, parse_when

    if _AGO.match(text):
        from datetime import UTC

        return datetime.now(UTC) - parse_ttl(text.strip())
    try:
        return parse_when(text, "time")
    except InvalidInput:
        raise InvalidInput(f"{text!r} is neither an ISO 8601 time with a timezone (e.g. 2026-01-01T00:00:00Z) nor a "
                           "time ago (e.g. 30m, 1h, 7d)") from None


def _seconds(text: str) -> int:
    if not is_digits(text.strip()) or int(text) <= 0:
        raise InvalidInput(f"{text!r} is not a positive number of seconds")
    return int(text)


def _https_url(text: str) -> str:
    """An https:// URL (the node agent talks to the API over mTLS only)."""
    url = _url(text)
    if not url.startswith("https://"):
        raise InvalidInput(f"{redacted(text)!r}: the agent talks to the API over HTTPS only (https://HOST:PORT)")
    return url


def _device_url(text: str) -> str:
    """A switch's NVUE API: https://, or http:// on this machine only (its credentials never travel in clear)."""
    url = _url(text)
    host = urlsplit(url).hostname or ""
    if not url.startswith("https://") and host not in ("127.0.0.1", "::1", "localhost"):
        raise InvalidInput(f"{redacted(text)!r}: a switch's API is reached over https:// (http:// only on 127.0.0.1)")
    return url


def _port_map(text: str) -> str:
    name, sep, port = text.partition("=")
    if not sep:
        raise InvalidInput(f"{text!r} is not FABRIC-PORT=BRIDGE-PORT (e.g. pf0vf0=pf0vf0_r)")
    _word("port name")(name)
    _word("bridge port name")(port)
    return text


def _join_token(text: str) -> str:
    token = text.strip()
    if not token.startswith("tfjt_") or len(token) > 256:
        raise InvalidInput("not a join token (tfjt_...: `trustfabric node token create --node NAME` prints one)")
    return token


def _host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidInput(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9100)")
    _port(port)
    return text


def _cidr(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(text.strip(), strict=True))
    except ValueError as exc:
        raise InvalidInput(f"{text!r} is not a CIDR network ({exc})") from None


def _cidr6(text: str) -> str:
    out = _cidr(text)
    if ":" not in out:
        raise InvalidInput(f"{text!r} is not an IPv6 network (e.g. fd00:1::/48)")
    return out


def _address(version: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        import ipaddress

        try:
            addr = ipaddress.ip_address(text.strip())
        except ValueError:
            raise InvalidInput(f"{text!r} is not an IPv{version} address") from None
        if addr.version != version:
            raise InvalidInput(f"{text!r} is not an IPv{version} address")
        return str(addr)

    return parse


def _word(what: str) -> Callable[[str], str]:
    """A name of the fabric file's kind (a port, a switch model): 1-63 characters, no spaces, no ':'."""

    def parse(text: str) -> str:
        if not text or len(text) > 63 or ":" in text or any(c.isspace() for c in text):
            raise InvalidInput(f"{text!r} is not a {what} (1-63 characters, no spaces or ':')")
        return text

    return parse


def _endpoint(text: str) -> str:
    device, sep, port = text.partition(":")
    if not sep:
        raise InvalidInput(f"{text!r} is not DEVICE:PORT (e.g. leaf1:swp1)")
    return f"{_slug(device)}:{_word('port name')(port)}"


def _device(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or kind not in ("nic", "leaf"):
        raise InvalidInput(f"{text!r} is not a device: nic:<node> or leaf:<name> (e.g. nic:gpu1)")
    return f"{kind}:{_slug(name)}"


def _workload(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 3:
        raise InvalidInput(f"{text!r} is not TENANT/GROUP/NAME (e.g. acme/train/w1)")
    return "/".join(_slug(p) for p in parts)


def _tenant_or_workload(text: str) -> str:
    """A tenant, or a whole TENANT/GROUP/NAME: `workload show acme/train/w1` as `workload place` takes it."""
    return _workload(text) if "/" in text else _slug(text)


def _selector(text: str) -> str:
    from pki.selectors import parse_selector

    return ":".join(parse_selector(text))


def _policy_ref(text: str) -> str:
    t = text.strip().lower()
    if not (is_digits(t) and int(t) >= 1) and not (len(t) >= 8 and all(c in "0123456789abcdef" for c in t)):
        raise InvalidInput(f"{text!r} is neither a policy version number nor a content-hash prefix (8+ hex digits)")
    return t


def _grant_id(text: str) -> str:
    from cli.ids import GRANT_ID_SHAPE, id_or_prefix

    return id_or_prefix(text, GRANT_ID_SHAPE, "grant", "g-0190a3c4d5e6-0123456789abcdef, or g-0190a3")


def _token_id(text: str) -> str:
    from cli.ids import TOKEN_ID_SHAPE, id_or_prefix

    return id_or_prefix(text, TOKEN_ID_SHAPE, "token", "3f2a9c0d1e4b5a6f7c8d9e0f1a2b3c4d, or 3f2a9c")


def _query(text: str) -> str:
    from policy.errors import require_query  # light: the policy package's errors alone

    return require_query(text)


def choice(*values: str) -> Check:
    """One of `values`; the error lists them."""

    def parse(text: str) -> str:
        if text not in values:
            raise InvalidInput(f"{text!r} is not one of {', '.join(values)}")
        return text

    return Check(parse, good=values[0], bad="nope", metavar="|".join(values) if len(values) <= 6 else "CHOICE")


PORT = Check(_port, good="8443", bad="99999", metavar="PORT")
PORT_MAYBE_PROTO = Check(_port_maybe_proto, good="udp/4791", bad="icmp/1", metavar="[PROTO/]PORT")
URL = Check(_url, good="http://127.0.0.1:1", bad="127.0.0.1:8443", metavar="URL")
HTTPS_URL = Check(_https_url, good="https://127.0.0.1:1", bad="http://127.0.0.1:8443", metavar="URL")
JOIN_TOKEN = Check(_join_token, good="tfjt_x", bad="tfo_admin", metavar="TOKEN")
DEVICE_URL = Check(_device_url, good="https://leaf1:8765", bad="http://leaf1:8765", metavar="URL")
PORT_MAP = Check(_port_map, good="p0=p0", bad="p0", metavar="PORT=NAME")
HOST_PORT = Check(_host_port, good="127.0.0.1:9100", bad="127.0.0.1", metavar="HOST:PORT")
SLUG = Check(_slug, good="acme", bad="Not_A_Slug", metavar="NAME")
TRUST_DOMAIN = Check(_trust_domain, good="example.org", bad="Example.ORG/path", metavar="DOMAIN")
ACTION = Check(_action, good="grant.approve", bad="approve", metavar="ACTION")
IDENTITY = Check(_identity, good="acme/web", bad="acme", metavar="ID|TENANT/GROUP")
TENANT_GROUP = Check(_tenant_group, good="acme/web", bad="globex", metavar="TENANT/GROUP")
PROTO_PORT = Check(_proto_port, good="tcp/443", bad="tcp/99999", metavar="PROTO/PORT")
LABEL = Check(_label, good="tier=gpu", bad="no-equals-sign", metavar="KEY=VALUE")
TTL = Check(_ttl, good="1h", bad="soon", metavar="TTL")
WHEN = Check(_when, good="2026-01-01T00:00:00Z", bad="yesterday", metavar="TIME")
SECONDS = Check(_seconds, good="60", bad="-5", metavar="SECONDS")
PROTO = choice("tcp", "udp")
CIDR = Check(_cidr, good="10.1.0.0/16", bad="10.1.0.1/16", metavar="CIDR")
CIDR6 = Check(_cidr6, good="fd00:1::/48", bad="10.1.0.0/16", metavar="CIDR6")
IPV4 = Check(_address(4), good="10.1.0.11", bad="10.1.0.300", metavar="IPV4")
IPV6 = Check(_address(6), good="fd00:1::11", bad="10.1.0.11", metavar="IPV6")
PORT_NAME = Check(_word("port name"), good="swp1", bad="swp 1", metavar="PORT")
BRIDGE = Check(_word("bridge name"), good="br-int", bad="br int", metavar="BRIDGE")
USER = Check(_word("user name"), good="cumulus", bad="a user", metavar="USER")
MODEL = Check(_word("switch model"), good="sn5600", bad="sn 5600", metavar="MODEL")
ENDPOINT = Check(_endpoint, good="leaf1:swp1", bad="leaf1", metavar="DEVICE:PORT")
DEVICE = Check(_device, good="nic:gpu1", bad="gpu1", metavar="DEVICE")
WORKLOAD = Check(_workload, good="acme/train/w1", bad="acme/train", metavar="TENANT/GROUP/NAME")
TENANT_OR_WORKLOAD = Check(_tenant_or_workload, good="acme", bad="acme/train", metavar="TENANT[/GROUP/NAME]")
SELECTOR = Check(_selector, good="unix:uid:1001", bad="uid:1001", metavar="SELECTOR")
POLICY_REF = Check(_policy_ref, good="2", bad="v2", metavar="N|HASH")
QUERY = Check(_query, good="data.flows.decision", bad="# no expression", metavar="QUERY")
GRANT_ID = Check(_grant_id, good="g-0190", bad="grant-7", metavar="GRANT_ID")
TOKEN_ID = Check(_token_id, good="3f2a9c", bad="not-hex", metavar="TOKEN_ID")


def existing_file(**kw: Any) -> dict[str, Any]:
    """typer.Option/Argument keywords for a file that must exist (a folder is refused)."""
    return {"exists": True, "file_okay": True, "dir_okay": False, "readable": True, **kw}


def _existing_file_or_dash(value: str | None) -> str | None:
    """existing_file's checks, made here: typer 0.29 compares the Path it builds with "-" (never equal), so its own
    checks refused `-` as a missing file however allow_dash was set."""
    import os

    if value is None or value == "-":
        return value
    path = Path(value)
    if not path.exists():
        raise typer.BadParameter(f"file {value!r} does not exist.")
    if path.is_dir():
        raise typer.BadParameter(f"file {value!r} is a directory.")
    if not os.access(path, os.R_OK):
        raise typer.BadParameter(f"file {value!r} is not readable.")
    return value


def existing_file_or_dash(**kw: Any) -> dict[str, Any]:
    """typer.Option keywords for a file that must exist, or `-` for standard input; the option is a str (a Path
    would be checked by typer, which refuses `-`)."""
    return {**existing_file(allow_dash=True), "callback": _existing_file_or_dash, **kw}


def _in_existing_folder(value: Path | None) -> Path | None:
    """A file to write must be in a folder that exists: checked while parsing, before the command does (and
    perhaps audits) anything it could then not deliver. `-` is refused: a Unix user means standard output by it,
    and it was written as a file named `-` (an export, an SVID's certificate chain: where nobody looks)."""
    if value is None:
        return value
    if str(value) == "-":
        raise typer.BadParameter("'-' would be a file named '-': this option writes a file, never standard output; "
                                 "give a file name")
    folder = value.parent
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is not a folder" if folder.exists() else f"folder {folder} does not exist")
    return value


def new_file(**kw: Any) -> dict[str, Any]:
    """typer.Option keywords for a file to write: a folder is refused, and so is a file in a missing folder."""
    return {"file_okay": True, "dir_okay": False, "callback": _in_existing_folder, **kw}


def existing_dir(**kw: Any) -> dict[str, Any]:
    """typer.Option/Argument keywords for a folder that must exist (a file is refused)."""
    return {"exists": True, "file_okay": False, "dir_okay": True, "readable": True, **kw}
