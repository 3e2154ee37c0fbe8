"""The CLI's HTTP client: server URL and credentials from flags, the environment or the selected profile.
Python's own http.client (a third of httpx's start-up time: every remote command pays it).

Each value, first found wins: the command's flag (--server, --cacert), the environment
(TRUSTFABRIC_SERVER, TRUSTFABRIC_TOKEN, TRUSTFABRIC_CA_FILE; read, like every variable, in
workflows/settings.py), the profile `trustfabric login` stored (cli/config.py), the default server.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from core.errors import InvalidInput, TrustfabricError
from workflows.settings import ClientSettings

DEFAULT_SERVER = "http://127.0.0.1:8443"


class ApiError(TrustfabricError):
    """The server answered with an error (the message is its reason) or could not be reached; to anything
    that would relay it, an upstream failure (502). `status` is the server's own answer."""

    http_status = 502

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def check_server(url: str, source: str) -> str:
    """The URL when it is http(s)://host[:port]; InvalidInput naming where it came from otherwise."""
    from cli.params import URL

    try:
        return str(URL._parse(url))
    except InvalidInput as exc:
        raise InvalidInput(f"{source}: {exc}") from None


@dataclass
class Client:
    server: str
    token: str | None
    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout: float = 30.0
    # where the token came from, for the next step when the server refuses it: TRUSTFABRIC_TOKEN, or the profile
    # of this name (neither: given by the caller, `login`'s own)
    token_env: bool = False
    token_profile: str | None = None

    @classmethod
    def from_env(cls, server: str | None = None, *, ca_file: str | None = None, cert: str | None = None,
                 key: str | None = None, token: str | None = None) -> Client:
        from cli.config import selected_profile

        e = ClientSettings.from_env()
        prof = selected_profile()
        if server:
            url = check_server(server, "--server")
        elif e.server:
            url = check_server(e.server, "TRUSTFABRIC_SERVER")
        elif prof.server:
            url = check_server(prof.server, f"profile {prof.name!r}")
        else:
            url = DEFAULT_SERVER
        return cls(
            server=url,
            token=token or e.token or prof.token,
            token_env=not token and bool(e.token),
            token_profile=prof.name if not (token or e.token) and prof.token else None,
            ca_file=ca_file or e.ca_file or prof.ca_file,
            cert=cert or prof.cert,
            key=key or prof.key,
        )

    @property
    def shown(self) -> str:
        """The server URL as printed: without its userinfo."""
        from cli.params import redacted

        return redacted(self.server)

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        """A connection to the server; TLS verified against `ca_file` (else the system's roots), with the
        client certificate when one is configured. OSError for unreadable TLS material."""
        parts = urlsplit(self.server)
        wait = timeout or self.timeout
        if parts.scheme == "https":
            import ssl

            ctx = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
            if self.cert and self.key:
                ctx.load_cert_chain(self.cert, self.key)
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=wait, context=ctx)
        return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=wait)

    def _headers(self, accept: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"Accept": accept, "User-Agent": "trustfabric-cli", **(extra or {})}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _target(self, path: str, params: dict[str, Any] | None = None) -> str:
        # a list is a repeated parameter (`ports=22&ports=443`), as FastAPI reads a list query
        query = urlencode([(k, _param(x)) for k, v in (params or {}).items() if v is not None
                           for x in (v if isinstance(v, list | tuple) else [v])])
        return urlsplit(self.server).path.rstrip("/") + path + (f"?{query}" if query else "")

    def _refused(self, method: str, target: str, status: int, raw: bytes) -> ApiError:
        """The error an answer of HTTP `status` >= 400 stands for: the API's reason, never another server's page."""
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        reason = answer.get("reason") if isinstance(answer, dict) else None
        if not reason:  # not the API's error shape (a proxy's or another server's page): never its HTML
            return ApiError(f"{self.shown} answered {method} {target} with HTTP {status} and no error reason: "
                            "is it the trustfabric API's URL?", status, answer)
        if status == 404 and isinstance(answer, dict) and answer.get("error") == "http_error":  # no route
            return ApiError(f"{self.shown} has no route {method} {target} (HTTP 404): is it the trustfabric "
                            "API's base URL?", status, answer)
        return ApiError(f"{reason} (HTTP {status}){self._refused_hint(status, reason)}", status, answer)

    def _refused_hint(self, status: int, reason: str = "") -> str:
        """The next step when the server refuses the credential: the API's 401 speaks of headers and tokens, a
        command-line user signs in (again), with the profile or variable the token came from named."""
        if status != 401:
            return ""
        if reason.startswith("malformed bearer token") and self.token_profile is None and not self.token_env:
            # PyJWT's words (`Not enough segments`) for what was typed or piped to `login`
            return (" -- it is not an API token (one from `trustfabric token create` starts with eyJ, the bootstrap "
                    "admin token with tfo_): give the whole token")
        if not self.token and not (self.cert and self.key):
            return " -- no token was sent: sign in with `trustfabric login --server URL`, or set TRUSTFABRIC_TOKEN"
        if self.token_profile is not None:
            return (f" -- the token of profile {self.token_profile!r} was refused: sign in again with a new one, "
                    f"`trustfabric --profile {self.token_profile} login --server {self.shown}`")
        if self.token_env:
            return " -- the token in TRUSTFABRIC_TOKEN was refused: set a new one (`trustfabric token create`)"
        return ""

    def _unreachable_hint(self, error: BaseException | None) -> str:
        """What to do next, for the connection failures a first run meets (README, Troubleshooting): the
        exception's text alone (`[SSL: WRONG_VERSION_NUMBER]`, `Remote end closed connection`) does not say."""
        import ssl

        https = urlsplit(self.server).scheme == "https"
        if isinstance(error, ConnectionRefusedError):
            return (" -- nothing listens there: start `trustfabric serve`, or point --server, TRUSTFABRIC_SERVER or "
                    "the profile at the API (`trustfabric status` shows which is used)")
        if isinstance(error, ssl.SSLCertVerificationError):
            return (" -- give the trust domain's roots: --ca FILE or TRUSTFABRIC_CA_FILE (`trustfabric bundle show "
                    "--pem` on the server host writes them)")
        if https and isinstance(error, ssl.SSLError) and "WRONG_VERSION_NUMBER" in str(error):
            return " -- the server answers in plain HTTP, not TLS: use http://"
        if not https and isinstance(error, http.client.RemoteDisconnected):
            return " -- a server started with --tls answers only HTTPS: if it runs so, use https://"
        return ""

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None, retries: int = 2) -> Any:
        """The decoded JSON answer, or ApiError with the server's reason. Connection failures are retried
        (POSTs carry an Idempotency-Key when the caller gives one, so a retry is safe)."""
        h = self._headers("application/json", headers)
        body: bytes | None = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        target = self._target(path, params)
        status: int | None = None
        raw = b""
        error: Exception | None = None
        for _attempt in range(retries + 1):
            try:
                conn = self._connection()
            except OSError as exc:  # unreadable CA / client certificate files, bad TLS material
                raise ApiError(f"cannot set up the connection to {self.shown}: {exc}") from None
            try:
                conn.request(method, target, body=body, headers=h)
                response = conn.getresponse()
                status, raw = response.status, response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                error = exc
                if method != "GET" and "Idempotency-Key" not in h:
                    break
            finally:
                conn.close()
        if status is None:
            raise ApiError(f"cannot reach {self.shown}: {error}{self._unreachable_hint(error)}")
        if status >= 400:
            raise self._refused(method, target, status, raw)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def download(self, path: str, body: Any, receive: Callable[[str], Callable[[bytes], None]], *,
                 timeout: float = 600.0, chunk: int = 1 << 16) -> None:
        """POST `body` and hand a successful answer's body, piece by piece as it arrives (constant memory: an
        export may be larger than memory), to the sink `receive(its Content-Type)` returns. ApiError for an
        error answer (as `request`), for a server that cannot be reached, and for an answer cut short (the
        connection lost, or fewer bytes than announced): the caller then discards what it received. Never
        retried: the server records each export it answers. `timeout` bounds each wait, the first byte's too,
        which comes only once the server has written the whole export."""
        h = self._headers("*/*", {"Content-Type": "application/json"})
        target = self._target(path)
        try:
            conn = self._connection(timeout)
        except OSError as exc:  # unreadable CA / client certificate files, bad TLS material
            raise ApiError(f"cannot set up the connection to {self.shown}: {exc}") from None
        try:
            try:
                conn.request("POST", target, body=json.dumps(body).encode(), headers=h)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise ApiError(f"cannot reach {self.shown}: {exc}{self._unreachable_hint(exc)}") from None
            if response.status >= 400:
                raise self._refused("POST", target, response.status, _read_all(response))
            sink = receive(response.getheader("Content-Type") or "")
            while True:
                try:
                    piece = response.read(chunk)
                    if not piece and response.length:  # a sized body ended early: http.client says nothing
                        raise http.client.IncompleteRead(b"", response.length)
                except (OSError, http.client.HTTPException) as exc:
                    raise ApiError(f"the answer from {self.shown} was cut short ({type(exc).__name__})") from None
                if not piece:
                    return
                sink(piece)  # its own errors (a full disk) are its own, not the server's
        finally:
            conn.close()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, *, idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", path, json_body=body, headers=headers)

    def pages(self, path: str, *, limit: int = 200, **params: Any) -> list[Any]:
        """Every item of a cursor-paged listing."""

        def page(cursor: Any) -> tuple[list[Any], Any]:
            answer = self.get(path, limit=limit, cursor=cursor, **params)
            return answer.get("items", []), answer.get("next_cursor")

        return walk_pages(page, path)


MAX_PAGES = 10_000  # 2 million items at the CLI's 200 a page: far beyond any listing, short of looping forever


def walk_pages(fetch: Callable[[Any], tuple[list[Any], Any]], listing: str, max_pages: int = MAX_PAGES) -> list[Any]:
    """Every item of a paged listing: `fetch(cursor)` answers a page's items and the next page's cursor (none: the
    last page; the first call gets None). A server that hands back a cursor it gave before, or pages on past
    `max_pages`, would keep the command fetching forever (and its memory growing): ApiError naming the listing."""
    items: list[Any] = []
    seen: set[Any] = set()
    cursor: Any = None
    for _ in range(max_pages):
        got, cursor = fetch(cursor)
        items.extend(got)
        if cursor is None or cursor == "":
            return items
        if cursor in seen:
            raise ApiError(f"the server's paging of {listing} does not advance: it gave the cursor {cursor!r} "
                           f"again after {len(seen) + 1} pages")
        seen.add(cursor)
    raise ApiError(f"the server's paging of {listing} did not end within {max_pages} pages")


def _read_all(response: http.client.HTTPResponse) -> bytes:
    """An error answer's body (small: the API's JSON reason), or nothing if it cannot be read through."""
    try:
        return response.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return b""


def _param(value: Any) -> str:
    """A query value as the API parses it (booleans lowercase)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def new_idempotency_key() -> str:
    return uuid.uuid4().hex
