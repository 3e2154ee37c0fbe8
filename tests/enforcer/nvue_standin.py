"""A stand-in for a Cumulus switch's NVUE REST API (the hardware cannot exist here).

It keeps the semantics the backend relies on: revisions are copies of the applied configuration that PATCH
(deep merge; null deletes) and DELETE change; applying a revision validates it against the NVUE schema of
our subset and against the switch's physical ports, then replaces the applied configuration whole - or
marks the revision invalid and leaves the applied configuration exactly as it was.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from enforcer.render.nvue import validate_nvue

API = "/nvue_v1"


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


SWITCH_PORTS = tuple(f"swp{n}" for n in range(1, 65))


class NvueStandIn:
    """`changeset_ids`: name revisions as Cumulus Linux 5.0-5.3 do (`changeset/<user>/<timestamp>`, slashes and
    all, so a client must percent-encode the id in a path); otherwise as 5.4+ do ("1", "2", ...)."""

    def __init__(self, ports: tuple[str, ...] = SWITCH_PORTS, changeset_ids: bool = False) -> None:
        self.ports = set(ports)
        self.changeset_ids = changeset_ids
        self.applied: dict[str, Any] = {"system": {"hostname": "leaf"}, "interface": {"eth0": {"type": "eth"}}}
        self.revisions: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> NvueStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def _problems(self, config: dict[str, Any]) -> list[str]:
        ours = {k: v for k, v in config.items() if k not in ("system",)}
        ours["interface"] = {k: v for k, v in config.get("interface", {}).items() if k != "eth0"}
        if not ours["interface"]:
            ours.pop("interface")
        problems = validate_nvue(ours)
        for name, body in config.get("interface", {}).items():
            base = body.get("base-interface")
            if base is not None and base not in self.ports:
                problems.append(f"interface {name}: no such port {base}")
        acls = set(config.get("acl", {}))
        for name, body in config.get("interface", {}).items():
            for acl in body.get("acl", {}):
                if acl not in acls:
                    problems.append(f"interface {name}: unknown acl {acl}")
        return problems

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _parts(self) -> tuple[list[str], dict[str, list[str]]]:
                url = urlparse(self.path)
                if not url.path.startswith(API):
                    return [], {}
                # split the raw path first: an id's %2F is part of one segment, not a separator
                return [unquote(p) for p in url.path[len(API):].split("/") if p], parse_qs(url.query)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def do_GET(self) -> None:
                parts, q = self._parts()
                with standin.lock:
                    if parts[:1] == ["revision"] and len(parts) == 2:
                        rev = standin.revisions.get(parts[1])
                        return self._send(200, {"state": rev["state"]}) if rev else self._send(404, {})
                    rev_id = q.get("rev", ["applied"])[0]
                    node: Any = standin.applied if rev_id == "applied" else standin.revisions[rev_id]["config"]
                    for p in parts:
                        if not isinstance(node, dict) or p not in node:
                            return self._send(404, {"title": "not found"})
                        node = node[p]
                    self._send(200, node)

            def do_POST(self) -> None:
                parts, _ = self._parts()
                if parts != ["revision"]:
                    return self._send(404, {})
                with standin.lock:
                    n = len(standin.revisions) + 1
                    rev = f"changeset/cumulus/2024-01-01_00.00.{n:02d}_AB{n:02d}" if standin.changeset_ids else str(n)
                    standin.revisions[rev] = {"state": "pending", "config": copy.deepcopy(standin.applied)}
                self._send(200, {rev: {"state": "pending"}})

            def do_PATCH(self) -> None:
                parts, q = self._parts()
                body = self._body()
                with standin.lock:
                    if parts[:1] == ["revision"] and len(parts) == 2:
                        rev = standin.revisions.get(parts[1])
                        if rev is None or rev["state"] != "pending" or body.get("state") != "apply":
                            return self._send(400, {"title": "bad revision request"})
                        problems = standin._problems(rev["config"])
                        if problems:
                            rev["state"] = "invalid"
                            rev["errors"] = problems
                        else:
                            standin.applied = copy.deepcopy(rev["config"])
                            rev["state"] = "applied"
                        return self._send(200, {"state": rev["state"]})
                    rev = standin.revisions.get(q.get("rev", [""])[0])
                    if rev is None or rev["state"] != "pending":
                        return self._send(400, {"title": "PATCH needs a pending ?rev="})
                    node = rev["config"]
                    for p in parts:
                        node = node.setdefault(p, {})
                    _merge(node, body)
                    self._send(200, {})

            def do_DELETE(self) -> None:
                parts, q = self._parts()
                with standin.lock:
                    rev = standin.revisions.get(q.get("rev", [""])[0])
                    if rev is None or rev["state"] != "pending" or not parts:
                        return self._send(400, {"title": "DELETE needs a pending ?rev= and a path"})
                    node = rev["config"]
                    for p in parts[:-1]:
                        node = node.get(p, {})
                    node.pop(parts[-1], None)
                    self._send(200, {})

        return Handler
