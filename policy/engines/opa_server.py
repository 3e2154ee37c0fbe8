"""An OPA server (or `trustfabric pdp`) as the engine, through opa-python-client.

`rego_compat=False` on every upload: the client otherwise rewrites a rejected policy and retries,
which would load something other than what was reviewed. Any failure (connection, timeout, HTTP
error, malformed answer) raises PolicyEngineError: callers deny. Module ids are `<prefix>/<path>`,
so modules this engine did not load are never touched.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from opa_client.errors import ConnectionsError, PolicyNotFoundError, QueryExecuteError, RegoParseError
from opa_client.opa import OpaClient

from core.errors import InvalidInput
from policy.engines.patch import PatchOp, apply_patch, split_rule_path
from policy.errors import (
    QUERY_PARSE_MESSAGE,
    PolicyCompileError,
    PolicyEngineError,
    PolicyEngineUnavailable,
    QueryParseError,
    SourceLocation,
    require_query,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpaSettings:
    """Where the server is and how to talk to it."""

    url: str = "http://127.0.0.1:8181"
    token: str | None = None  # bearer token
    ca_bundle: str | None = None  # verify the server against this CA file (https); system CAs when None
    client_cert: tuple[str, str] | None = None  # (cert, key) for mutual TLS
    timeout: float = 2.0  # seconds, per request
    retries: int = 0  # the client's own retries on 500/502/504
    prefix: str = "trustfabric"


class OpaServerEngine:
    """PolicyEngine over an OPA REST server; one client per thread (requests sessions are not shared)."""

    def __init__(self, settings: OpaSettings) -> None:
        parts = urlsplit(settings.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(f"OPA URL {settings.url!r} must be http(s)://host:port")
        self.settings = settings
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: bool | str = False
        if parts.scheme == "https":
            self._ssl = settings.ca_bundle or True
        self._local = threading.local()
        self._clients: list[OpaClient] = []
        self._lock = threading.Lock()
        self._modules: dict[str, str] = {}
        self._data: dict[str, Any] = {}

    def _client(self) -> OpaClient:
        client: OpaClient | None = getattr(self._local, "client", None)
        if client is None:
            client = OpaClient(
                host=self._host,
                port=self._port,
                ssl=self._ssl,  # True or a CA bundle path: the client hands it to requests' verify
                cert=self.settings.client_cert,
                token=self.settings.token,
                timeout=self.settings.timeout,
                retries=self.settings.retries,
            )
            if self.settings.ca_bundle:
                # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the session's CA file;
                # the configured CA must win (and no proxy from the environment sits in between)
                client._session.trust_env = False
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _id(self, path: str) -> str:
        return f"{self.settings.prefix}/{path}"

    # ---- state

    def load(self, modules: Mapping[str, str], data: Mapping[str, Any] | None = None) -> None:
        client = self._client()
        mods = {str(k): str(v) for k, v in modules.items()}
        previous: dict[str, str] = {}  # what the server held for each module this load writes
        written: list[str] = []  # modules changed on the server so far, put back if the load fails
        try:
            issues: list[SourceLocation] = []
            for path in sorted(mods):
                prior = self._server_module(client, path)
                if prior is not None:
                    previous[path] = prior
                try:
                    client.update_policy_from_string(mods[path], self._id(path), rego_compat=False)
                    written.append(path)
                except Exception as exc:
                    found = _compile_issues(exc, path, self.settings.prefix)
                    if found is None:
                        raise
                    issues.extend(found)
            if issues:
                raise PolicyCompileError(issues)
            keep = {self._id(p) for p in mods}
            for pid in client.get_policies_list():
                if pid.startswith(self.settings.prefix + "/") and pid not in keep:
                    client.delete_policy(pid)
        except PolicyCompileError:
            self._restore(client, previous, written)
            raise
        except Exception as exc:
            self._restore(client, previous, written)
            raise _failure(f"OPA server at {self.settings.url}: loading policies failed: {_msg(exc)}", exc) from exc
        self._modules = mods
        if data is not None:
            self.set_data(data)

    def _server_module(self, client: OpaClient, path: str) -> str | None:
        """The module's text on the server now; None when it has none under that id."""
        try:
            answer = client.get_policy(self._id(path))
        except PolicyNotFoundError:
            return None
        raw = (answer.get("result") or {}).get("raw") if isinstance(answer, dict) else None
        return raw if isinstance(raw, str) else None

    def _restore(self, client: OpaClient, previous: Mapping[str, str], written: Sequence[str]) -> None:
        """Undo a failed load: every module it wrote goes back to what it was (or away), so the server
        keeps answering with the modules in force before; a failure here is logged (the server is then
        in an unknown state and the caller's decisions fail closed on the next error)."""
        for path in reversed(written):
            try:
                if path in previous:
                    client.update_policy_from_string(previous[path], self._id(path), rego_compat=False)
                else:
                    client.delete_policy(self._id(path))
            except Exception as exc:
                log.error("OPA server at %s: could not restore module %s after a failed load: %s",
                          self.settings.url, path, _msg(exc))

    def set_data(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidInput("the data document must be an object")
        client = self._client()
        try:
            for key, value in data.items():
                if not isinstance(value, Mapping):
                    raise InvalidInput(f"top-level data key {key!r} must hold an object")
                client.update_or_create_data(dict(value), key)
            for key in set(self._data) - set(data):
                client.delete_data(key)
        except InvalidInput:
            raise
        except Exception as exc:
            raise _failure(f"OPA server at {self.settings.url}: writing data failed: {_msg(exc)}", exc) from exc
        self._data = dict(data)

    def patch_data(self, ops: Sequence[PatchOp]) -> None:
        if not ops:
            return
        doc = apply_patch(self._data, ops)  # validate locally first: nothing is sent for a bad patch
        try:
            self._client().patch_data("", [dict(op) for op in ops])
        except Exception as exc:
            raise _failure(f"OPA server at {self.settings.url}: patching data failed: {_msg(exc)}", exc) from exc
        self._data = doc

    def data(self) -> Mapping[str, Any]:
        return self._data

    def modules(self) -> dict[str, str]:
        return dict(self._modules)

    def warm(self) -> None:
        """Nothing to prepare per thread: OPA holds the policy and the data."""

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close_connection()
            self._clients.clear()

    # ---- evaluation

    def evaluate(self, query: str, input: Any = None) -> Any:
        client = self._client()
        try:
            rule = split_rule_path(query)
            if rule is not None:
                out = client.query_rule(input if input is not None else {}, rule[0], rule[1])
                if not isinstance(out, dict):
                    raise PolicyEngineError(f"unexpected answer {out!r}")
                return out.get("result")
            out = client.ad_hoc_query(f"__tf_value := {query}", input if input is not None else {})
            rows = out.get("result") or []
            return rows[0].get("__tf_value") if rows else None
        except PolicyEngineError:
            raise
        except Exception as exc:
            raise _failure(f"OPA server at {self.settings.url}: evaluating {query}: {_msg(exc)}", exc) from exc

    def query(self, query: str, input: Any = None) -> list[dict[str, Any]]:
        require_query(query)  # OPA refuses it when compiling, in an answer _query_parse_issue does not read
        try:
            out = self._client().ad_hoc_query(query, input if input is not None else {})
        except Exception as exc:
            issue = _query_parse_issue(exc)
            if issue is not None:
                raise QueryParseError(issue) from None
            raise _failure(f"OPA server at {self.settings.url}: querying {query}: {_msg(exc)}", exc) from exc
        rows = out.get("result") if isinstance(out, dict) else None
        return [dict(r) for r in rows or [] if isinstance(r, dict)]

    def evaluate_many(self, query: str, inputs: Sequence[Any]) -> list[Any]:
        rule = split_rule_path(query)
        if rule is None or not inputs:
            return [self.evaluate(query, i) for i in inputs]
        try:
            values = self._client().bulk_query_rule(list(inputs), rule[0], rule[1])
        except Exception as exc:
            if isinstance(exc, QueryExecuteError):  # undefined for some input: ask one by one
                return [self.evaluate(query, i) for i in inputs]
            raise _failure(f"OPA server at {self.settings.url}: evaluating {query}: {_msg(exc)}", exc) from exc
        if not isinstance(values, list) or len(values) != len(inputs):
            raise PolicyEngineError(f"OPA server at {self.settings.url}: malformed bulk answer")
        return values


def _failure(message: str, exc: BaseException) -> PolicyEngineError:
    """Unreachable, timed out or a 5xx: the server is down (503); anything else: it answered, with an error."""
    down = isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionsError | OSError)
    response = getattr(exc, "response", None)
    if response is not None and getattr(response, "status_code", 0) >= 500:
        down = True
    return PolicyEngineUnavailable(message) if down else PolicyEngineError(message)


def _query_parse_issue(exc: BaseException) -> SourceLocation | None:
    """The first problem of the server's "error(s) occurred while parsing query" answer (400), else None."""
    response = getattr(exc, "response", None)
    if response is None or getattr(response, "status_code", 0) != 400:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("message") != QUERY_PARSE_MESSAGE:
        return None
    first = next(iter(body.get("errors") or []), None)
    err: dict[str, Any] = first if isinstance(first, dict) else {}
    loc: dict[str, Any] = err["location"] if isinstance(err.get("location"), dict) else {}
    return SourceLocation("", int(loc.get("row") or 1), int(loc.get("col") or 1),
                          str(err.get("message") or "the query does not parse"))


def _msg(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return f"{type(exc).__name__}: {message or exc}"


def _compile_issues(exc: Exception, path: str, prefix: str) -> list[SourceLocation] | None:
    """The server's compile errors as file:line:col, or None when `exc` is not a compile rejection."""
    if not isinstance(exc, RegoParseError) or exc.expression != "invalid_parameter":
        return None
    errors = exc.errors
    out: list[SourceLocation] = []
    for err in errors or []:
        loc = err.get("location") or {}
        out.append(
            SourceLocation(
                str(loc.get("file") or path).removeprefix(prefix + "/"),
                int(loc.get("row") or 1),
                int(loc.get("col") or 1),
                str(err.get("message") or err.get("code") or "compile error"),
            )
        )
    if not out:
        out.append(SourceLocation(path, 1, 1, str(getattr(exc, "message", None) or json.dumps(errors))))
    return out
