"""The CLI's HTTP client: server URL and credentials from flags, environment or a config file.

Token: `TRUSTFABRIC_TOKEN` (read, like every variable, in workflows/settings.py), else the config file
(`TRUSTFABRIC_CONFIG`, default `~/.config/trustfabric/config.json`). A config file readable by group or
others is refused: it holds a bearer secret. Config keys: server, token, ca_file (to verify an HTTPS
server), cert + key (mTLS).
"""

from __future__ import annotations

import json
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core.errors import InvalidInput, TrustfabricError
from workflows.settings import ClientSettings

DEFAULT_SERVER = "http://127.0.0.1:8443"
DEFAULT_CONFIG = Path("~/.config/trustfabric/config.json")


class ApiError(TrustfabricError):
    """The server answered with an error (the message is its reason) or could not be reached; to anything
    that would relay it, an upstream failure (502). `status` is the server's own answer."""

    http_status = 502

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def load_config(path: Path) -> dict[str, Any]:
    """The config file's settings; {} when there is none. Refuses files others can read or write."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(
            f"config file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"it holds a bearer token: run `chmod 600 {path}`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"config file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"config file {path} must hold a JSON object")
    return data


@dataclass
class Client:
    server: str
    token: str | None
    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout: float = 30.0

    @classmethod
    def from_env(cls, server: str | None = None, *, ca_file: str | None = None, cert: str | None = None,
                 key: str | None = None, env: dict[str, str] | None = None) -> Client:
        e = ClientSettings.from_env(env)
        conf = load_config(Path(e.config or DEFAULT_CONFIG).expanduser())
        return cls(
            server=(server or e.server or conf.get("server") or DEFAULT_SERVER).rstrip("/"),
            token=e.token or conf.get("token"),
            ca_file=ca_file or e.ca_file or conf.get("ca_file"),
            cert=cert or conf.get("cert"),
            key=key or conf.get("key"),
        )

    def _http(self) -> httpx.Client:
        verify: Any = True
        if self.server.startswith("https://"):
            import ssl

            ctx = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
            if self.cert and self.key:
                ctx.load_cert_chain(self.cert, self.key)
            verify = ctx
        return httpx.Client(base_url=self.server, timeout=self.timeout, verify=verify)

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None, retries: int = 2) -> Any:
        """The decoded JSON answer, or ApiError with the server's reason. Connection failures are retried
        (POSTs carry an Idempotency-Key when the caller gives one, so a retry is safe)."""
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        r: httpx.Response | None = None
        error: Exception | None = None
        for _attempt in range(retries + 1):
            try:
                with self._http() as http:
                    r = http.request(method, path, json=json_body, params=clean, headers=h)
                break
            except httpx.TransportError as exc:
                error = exc
                if method != "GET" and "Idempotency-Key" not in h:
                    break
            except OSError as exc:  # unreadable CA / client certificate files, bad TLS material
                raise ApiError(f"cannot set up the connection to {self.server}: {exc}") from None
        if r is None:
            raise ApiError(f"cannot reach {self.server}: {error}")
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code >= 400:
            reason = body.get("reason") if isinstance(body, dict) else None
            raise ApiError(f"{reason or r.text[:200] or 'request failed'} (HTTP {r.status_code})", r.status_code, body)
        return body

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, *, idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", path, json_body=body, headers=headers)

    def pages(self, path: str, *, limit: int = 200, **params: Any) -> list[Any]:
        """Every item of a cursor-paged listing."""
        items: list[Any] = []
        cursor: str | None = None
        while True:
            page = self.get(path, limit=limit, cursor=cursor, **params)
            items.extend(page.get("items", []))
            cursor = page.get("next_cursor")
            if not cursor:
                return items


def new_idempotency_key() -> str:
    return uuid.uuid4().hex
