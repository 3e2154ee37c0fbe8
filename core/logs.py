"""Structured logs: one JSON object a line (logfmt when stderr is a terminal), every line with its UTC
timestamp, level and logger, and whatever the call site passed as `extra` (the access log: request id,
principal, route template, status, latency). Secrets never reach the output: every message, argument and
extra field passes through `redact`, which replaces bearer tokens, JWTs, the project's opaque tokens and
PEM private keys with `[redacted]`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

FORMATS = ("auto", "json", "logfmt")
LEVELS = ("debug", "info", "warning", "error")

_SECRETS = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----"  # PEM private keys
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]+"  # an Authorization header's value
    r"|\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"  # a JWT (API token, JWT-SVID, OIDC)
    r"|\btf(?:o|jt)_[A-Za-z0-9_-]+",  # opaque API tokens, node join tokens
    re.DOTALL,
)
REDACTED = "[redacted]"

# LogRecord attributes that are not `extra` fields
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "color_message"}  # uvicorn's copy of the message with terminal colours


def redact(text: str) -> str:
    """`text` with every secret the patterns know replaced by [redacted]."""
    return _SECRETS.sub(REDACTED, text)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": redact(record.getMessage()),
    }
    for key, value in _extras(record).items():
        out[key] = redact(value) if isinstance(value, str) else value
    if record.exc_info:
        out["error"] = redact(logging.Formatter().formatException(record.exc_info))
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line (the format log shippers read)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str, separators=(",", ":"))


class LogfmtFormatter(logging.Formatter):
    """`ts=... level=info logger=... msg="..." key=value`, for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not re.search(r'[\s"=\\]', text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def configure(fmt: str = "auto", level: str = "info", *, stream: Any = None) -> logging.Handler:
    """Send every logger's records (uvicorn's included) to `stream` (stderr) in `fmt`; returns the handler.
    `auto` is logfmt on a terminal, JSON lines otherwise."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "logfmt" if getattr(stream, "isatty", lambda: False)() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):  # the process's logs are ours to format now (the CLI's default one too)
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):  # uvicorn's own lines, in the same format
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    access = logging.getLogger("uvicorn.access")  # raw paths and no principal: ours replaces it
    access.handlers.clear()
    access.propagate = False
    access.disabled = True
    return handler
