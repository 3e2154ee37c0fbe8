"""The OPA REST API subset opa-python-client uses, served over the embedded engine.

Node agents and other services ask decisions locally; and the OPA-server engine is tested over real
HTTP against it. Endpoints: /health; /v1/policies (GET), /v1/policies/{id} (GET, PUT, DELETE);
/v1/data/{path} (GET with ?input=, PUT, PATCH, POST, DELETE); /v1/query (GET ?q=, POST); POST / (the
default decision, data.system.main). Answers follow OPA's REST API reference: `{"result": ...}` (no
`result` key when undefined, a `warning` when a POST names no input), errors `{"code", "message"[,
"errors"]}`, `?pretty`, `?metrics`/`?instrument` (timers), `?provenance`, gzip request and response
bodies, YAML input; a path it does not serve, or a method a path does not take, answered as OPA's router answers
(`404 page not found` as text; 405). With a token configured every request but /health needs
`Authorization: Bearer <token>`, an unknown path's included.

When the PDP follows the database (pdp/sync.py: the active policy version and the current inventory and
grants), it is read-only, answering writes as OPA answers them when a bundle owns every path (400
invalid_parameter), so no local client can swap a module or add a grant behind the control plane's back
(and its audit log).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import zlib
from collections.abc import Callable
from importlib import metadata
from typing import Any

import yaml
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.middleware.gzip import GZipMiddleware

from core.asgi import BodySizeLimit
from core.errors import InvalidInput
from core.yaml_bound import value_budget
from policy.engines import EngineSettings, PolicyEngine, make_engine
from policy.errors import (
    QUERY_COMPILE_MESSAGE,
    QUERY_PARSE_MESSAGE,
    EmptyQuery,
    PolicyCompileError,
    PolicyEngineError,
    QueryParseError,
    SourceLocation,
)

log = logging.getLogger("trustfabric.pdp")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Unauthorized(Exception):
    pass


class _ReadOnly(Exception):
    pass


class _TooLarge(Exception):
    pass


BUNDLE = "trustfabric"  # the name this PDP gives the control plane's active version, as OPA names a bundle
DEFAULT_DECISION = "data.system.main"  # OPA's default `default_decision`
GZIP_MIN_BYTES = 1024  # OPA's default server.encoding.gzip.min_length


# OPA's server routes with Go's http.ServeMux (v1/server/server.go, initRouters): a path it has no route for is
# answered by the mux's NotFound (http.Error: text/plain, nosniff, "404 page not found"); a method its API
# paths (/v1/data, /v1/policies, /v1/query and below) do not take, by catch-all routes that write the bare
# status (writer.HTTPStatus: 405, no body); any other path's wrong method, by the mux (405, "Method Not
# Allowed", Allow naming the methods it takes, sorted).
OPA_API_PATHS = ("/v1/data", "/v1/policies", "/v1/query")
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
_TEXT = {"x-content-type-options": "nosniff"}


def _go_error(status: int, text: str, headers: dict[str, str] | None = None) -> PlainTextResponse:
    """Go's http.Error: the text and a newline, text/plain; charset=utf-8, nosniff."""
    return PlainTextResponse(text + "\n", status_code=status, headers={**_TEXT, **(headers or {})})


def _error(status: int, code: str, message: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status)


def _parse_error(issue: SourceLocation) -> dict[str, Any]:
    """One entry of OPA's `errors` list for a module or query that does not parse."""
    return {"code": "rego_parse_error", "message": issue.message,
            "location": {"file": issue.file, "row": issue.line, "col": issue.col}}


def _segments(path: str) -> list[str]:
    return [s for s in path.strip("/").split("/") if s]


_INT = re.compile(r"^[+-]?[0-9]+$")


def data_query(path: str) -> str:
    """'a/b-c/0' -> 'data.a["b-c"][0]': as OPA, a segment that reads as an integer indexes as one."""
    out = "data"
    for seg in _segments(path):
        if _IDENT.match(seg):
            out += f".{seg}"
        elif _INT.match(seg):
            out += f"[{int(seg)}]"
        else:
            out += f"[{json.dumps(seg)}]"
    return out


def _pointer(path: str) -> str:
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in _segments(path))


def _flag(request: Request, name: str) -> bool:
    """OPA's boolean query parameter: present without a value, or any value `true` (any case)."""
    values = request.query_params.getlist(name)
    return values == [""] or any(v.lower() == "true" for v in values)


def _ok(request: Request, body: Any) -> Response:
    """200 with `body` as JSON, indented under `?pretty`, as OPA answers."""
    if _flag(request, "pretty"):
        return Response(json.dumps(body, indent=2) + "\n", media_type="application/json")
    return JSONResponse(body)


async def _raw_body(request: Request, max_bytes: int) -> bytes:
    """The body, gunzipped when sent with `Content-Encoding: gzip` (never past `max_bytes`: a small bomb
    is refused, not inflated)."""
    raw = await request.body()
    if raw and request.headers.get("content-encoding", "").strip().lower() == "gzip":
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out = inflate.decompress(raw, max_bytes + 1)
        except zlib.error as exc:
            raise InvalidInput(f"could not decompress the body: {exc}") from exc
        if len(out) > max_bytes or inflate.unconsumed_tail:
            raise _TooLarge
        return out
    return raw


MAX_DEPTH = 127  # arrays/objects inside one another: the embedded engine's JSON reader stops at 128 levels


def _depth(value: Any) -> int:
    """How many arrays/objects are nested in `value` (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _too_deep(what: str) -> InvalidInput:
    return InvalidInput(f"{what} contains malformed input document: nested deeper than {MAX_DEPTH} levels")


def _values_within(value: Any, limit: int) -> bool:
    """Whether `value` holds at most `limit` values (containers, keys and scalars), counted without recursion and
    stopping at the limit (a shared subtree counts each time it is reached, as the engine will read it)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return False
        if isinstance(item, dict):
            count += len(item)  # the keys
            stack.extend(item.values())
        elif isinstance(item, list | tuple):  # tuples: YAML's !!pairs and !!omap
            stack.extend(item)
    return count <= limit


def _parse(raw: bytes | str, content_type: str, what: str) -> Any:
    """JSON, or YAML when the content type names it (OPA accepts both for input documents). YAML's aliases share a
    node, which everything after the parse (the depth check, the engine's JSON) expands: a few hundred bytes of
    nested aliases were billions of values ("billion laughs"). One that expands beyond what a document of its size may
    hold (core/yaml_bound.py) is refused (go-yaml, OPA's parser, refuses excessive aliasing too)."""
    try:
        if "yaml" not in content_type:
            return json.loads(raw)
        value = yaml.safe_load(raw)
    except RecursionError:  # Python's parsers recurse: ~1,000 levels end here, not in a 500
        raise _too_deep(what) from None
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{what} contains malformed input document: {exc}") from exc
    budget = value_budget(len(raw))
    if not _values_within(value, budget):
        raise InvalidInput(f"{what} contains malformed input document: its YAML aliases expand it to more than "
                           f"{budget} values")
    return value


def _checked_input(value: Any, what: str) -> Any:
    """The input, refused (400) when nested deeper than the engine reads, rather than failing its evaluation (500)."""
    if _depth(value) > MAX_DEPTH:
        raise _too_deep(what)
    return value


async def _json_body(request: Request, max_bytes: int) -> Any:
    raw = await _raw_body(request, max_bytes)
    if not raw.strip():
        return None
    return _parse(raw, request.headers.get("content-type", ""), "body")


def _version() -> str:
    try:
        return metadata.version("trustfabric")
    except metadata.PackageNotFoundError:
        return "unknown"


MAX_BODY_BYTES = 64 * 1024 * 1024  # a whole data document at 1,000 tenants x 5,000 grants is a few MB


def create_pdp_app(
    engine: PolicyEngine | None = None, *, token: str | None = None, read_only: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES, revision: Callable[[], str | None] | None = None,
) -> FastAPI:
    """The PDP over `engine` (any PolicyEngine; a fresh, empty embedded one when None); `read_only`: policies and data
    come from elsewhere (the database), every write is refused as OPA refuses a write to a bundle's path.
    Bodies above `max_body_bytes` (also once gunzipped) are refused with 413 before anything parses them.
    `revision`: the served policy's revision (the active version's hash), named in `?provenance`."""
    eng = engine if engine is not None else make_engine(EngineSettings(), "pdp")

    async def check_writable() -> None:
        if read_only:
            raise _ReadOnly

    def token_ok(request: Request) -> bool:
        if token is None:
            return True
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    async def check_token(request: Request) -> None:
        if not token_ok(request):
            raise _Unauthorized

    # a router dependency and exception handlers, not an HTTP middleware: ~1 ms less per request
    # no OpenAPI document and no redirect of a trailing slash: OPA serves neither, its clients expect neither
    app = FastAPI(title="trustfabric pdp", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    app.state.engine = eng
    v1 = APIRouter(dependencies=[Depends(check_token)])

    def unauthorized() -> JSONResponse:
        return _error(401, "unauthorized", "missing or invalid bearer token")

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(_r: Request, _e: _Unauthorized) -> JSONResponse:
        return unauthorized()

    @app.exception_handler(HTTPException)
    async def _no_route(request: Request, exc: HTTPException) -> Response:
        """A path or method no route takes, answered as OPA's mux answers it; with a token configured, only to
        a caller that has it (OPA's authorization runs before its router): no one else learns what is served."""
        if not token_ok(request):
            return unauthorized()
        if exc.status_code == 405:
            allowed = sorted(m.strip() for m in (exc.headers or {}).get("Allow", "").split(",") if m.strip())
            return _go_error(405, "Method Not Allowed", {"Allow": ", ".join(allowed)})
        if exc.status_code == 404:
            return _go_error(404, "404 page not found")
        return _error(exc.status_code, "invalid_parameter", str(exc.detail))

    @app.exception_handler(_ReadOnly)
    async def _read_only(_r: Request, _e: _ReadOnly) -> JSONResponse:
        # OPA's answer when a bundle owns every path: the control plane's active version is that bundle
        return _error(400, "invalid_parameter", f'all paths owned by bundle "{BUNDLE}": this PDP serves the '
                      "control plane's active policy version and data; change them through the trustfabric API")

    @app.exception_handler(_TooLarge)
    async def _too_large(_r: Request, _e: _TooLarge) -> JSONResponse:
        return _error(413, "invalid_parameter", "compressed request body too large")

    @app.exception_handler(PolicyCompileError)
    async def _compile(_r: Request, exc: PolicyCompileError) -> JSONResponse:
        return _error(400, "invalid_parameter", "error(s) occurred while compiling module(s)",
                      [_parse_error(i) for i in exc.issues])

    @app.exception_handler(QueryParseError)
    async def _query_parse(_r: Request, exc: QueryParseError) -> JSONResponse:
        return _error(400, "invalid_parameter", QUERY_PARSE_MESSAGE, [_parse_error(exc.issue)])

    @app.exception_handler(EmptyQuery)
    async def _empty_query(_r: Request, exc: EmptyQuery) -> JSONResponse:
        # OPA parses an empty query (to no expression) and refuses it when compiling, with no location
        return _error(400, "invalid_parameter", QUERY_COMPILE_MESSAGE,
                      [{"code": "rego_compile_error", "message": exc.issue.message}])

    @app.exception_handler(InvalidInput)
    async def _invalid(_r: Request, exc: InvalidInput) -> JSONResponse:
        return _error(400, "invalid_parameter", str(exc))

    @app.exception_handler(PolicyEngineError)
    async def _engine(_r: Request, exc: PolicyEngineError) -> JSONResponse:
        log.warning("pdp evaluation failed: %s", exc)
        if exc.http_status == 503:  # the engine behind this PDP (an OPA server) is down
            return _error(503, "unavailable", str(exc))
        return _error(500, "internal_error", str(exc))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {}

    @v1.get("/v1/policies")
    @v1.get("/v1/policies/")
    async def list_policies() -> dict[str, Any]:
        return {"result": [{"id": pid, "raw": raw} for pid, raw in sorted(eng.modules().items())]}

    @v1.get("/v1/policies/{policy_id:path}")
    async def get_policy(policy_id: str) -> Response:
        modules = eng.modules()
        if policy_id not in modules:
            return _error(404, "resource_not_found", f"storage_not_found_error: policy id {policy_id!r}")
        return JSONResponse({"result": {"id": policy_id, "raw": modules[policy_id]}})

    @v1.put("/v1/policies/{policy_id:path}", dependencies=[Depends(check_writable)])
    async def put_policy(policy_id: str, request: Request) -> Response:
        text = (await request.body()).decode("utf-8", errors="replace")
        if not text.strip():
            return _error(400, "invalid_parameter", "empty module")
        modules = eng.modules()
        modules[policy_id] = text
        eng.load(modules)
        return JSONResponse({})

    @v1.delete("/v1/policies/{policy_id:path}", dependencies=[Depends(check_writable)])
    async def delete_policy(policy_id: str) -> Response:
        modules = eng.modules()
        if policy_id not in modules:
            return _error(404, "resource_not_found", f"storage_not_found_error: policy id {policy_id!r}")
        del modules[policy_id]
        eng.load(modules)
        return JSONResponse({})

    def _value(request: Request, path: str, input: Any, *, named_input: bool = True) -> Response:
        """A Data API answer: the result (no key when undefined), and what OPA adds on request."""
        started = time.perf_counter_ns()
        value = eng.evaluate(data_query(path), input)
        elapsed = time.perf_counter_ns() - started
        body: dict[str, Any] = {} if value is None else {"result": value}
        if not named_input:
            body["warning"] = {"code": "api_usage_warning", "message": "'input' key missing from the request"}
        if _flag(request, "metrics") or _flag(request, "instrument"):
            body["metrics"] = {"timer_rego_query_eval_ns": elapsed,
                               "timer_server_handler_ns": time.perf_counter_ns() - started}
        if _flag(request, "provenance"):
            current = revision() if revision is not None else None
            body["provenance"] = {"version": f"trustfabric-{_version()}", "build_commit": "", "build_timestamp": "",
                                  "build_hostname": "",
                                  "bundles": {BUNDLE: {"revision": current}} if current else {}}
        return _ok(request, body)

    @v1.get("/v1/data")
    @v1.get("/v1/data/{path:path}")
    async def get_data(request: Request, path: str = "") -> Response:
        inputs = request.query_params.getlist("input")
        input = _checked_input(_parse(inputs[-1], "application/json", "parameter"), "parameter") if inputs else None
        return _value(request, path, input)

    @v1.post("/v1/data")
    @v1.post("/v1/data/{path:path}")
    async def post_data(request: Request, path: str = "") -> Response:
        body = await _json_body(request, max_body_bytes)
        if body is not None and not isinstance(body, dict):
            raise InvalidInput('body contains malformed input document: expected {"input": ...}')
        input = _checked_input(body.get("input"), "body") if body is not None else None
        return _value(request, path, input, named_input=input is not None)

    @v1.post("/")
    async def default_decision(request: Request) -> Response:
        """OPA's `POST /`: the body is the input, the answer the bare value of data.system.main."""
        input = _checked_input(await _json_body(request, max_body_bytes), "body")
        value = eng.evaluate(DEFAULT_DECISION, input)
        if value is None:
            return _error(404, "undefined_document", f"document missing: {DEFAULT_DECISION}")
        return _ok(request, value)

    @v1.put("/v1/data", dependencies=[Depends(check_writable)])
    @v1.put("/v1/data/{path:path}", dependencies=[Depends(check_writable)])
    async def put_data(request: Request, path: str = "") -> Response:
        value = await _json_body(request, max_body_bytes)
        pointer = _pointer(path)
        if not pointer:
            if not isinstance(value, dict):
                raise InvalidInput("the root document must be an object")
            eng.set_data(value)
        else:
            eng.patch_data([{"op": "add", "path": pointer, "value": value}])
        return Response(status_code=204)

    @v1.patch("/v1/data", dependencies=[Depends(check_writable)])
    @v1.patch("/v1/data/{path:path}", dependencies=[Depends(check_writable)])
    async def patch_data(request: Request, path: str = "") -> Response:
        ops = await _json_body(request, max_body_bytes)
        if not isinstance(ops, list):
            raise InvalidInput("PATCH body must be a JSON Patch array")
        base = _pointer(path)
        rebased = []
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("path"), str):
                raise InvalidInput("each patch operation needs a path")
            sub = op["path"] if op["path"] in ("", "/") or op["path"].startswith("/") else "/" + op["path"]
            rebased.append({**op, "path": base + ("" if sub == "/" else sub)})
        eng.patch_data(rebased)
        return Response(status_code=204)

    @v1.delete("/v1/data/{path:path}", dependencies=[Depends(check_writable)])
    async def delete_data(path: str) -> Response:
        try:
            eng.patch_data([{"op": "remove", "path": _pointer(path)}])
        except InvalidInput as exc:
            return _error(404, "resource_not_found", str(exc))
        return Response(status_code=204)

    def _rows(request: Request, query: str, input: Any) -> Response:
        rows = eng.query(query, input)
        return _ok(request, {"result": rows} if rows else {})  # OPA omits an empty result set

    @v1.get("/v1/query")
    async def query_get(request: Request) -> Response:
        queries = request.query_params.getlist("q")
        if not queries:
            raise InvalidInput("missing parameter 'q'")
        return _rows(request, queries[-1], None)

    @v1.post("/v1/query")
    async def query(request: Request) -> Response:
        body = await _json_body(request, max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("query", ""), str):
            raise InvalidInput('body must be {"query": "...", "input": ...}')
        # a body without "query" asks the empty query, as OPA reads it (its request type's zero value)
        return _rows(request, body.get("query", ""), _checked_input(body.get("input"), "body"))

    async def method_not_allowed() -> Response:
        return Response(status_code=405)  # OPA's writer.HTTPStatus(405): the status alone

    for base in OPA_API_PATHS:  # after every route above: a method they take never reaches these
        for path in (base, base + "/{rest:path}"):
            v1.add_api_route(path, method_not_allowed, methods=ANY_METHOD, include_in_schema=False)

    app.include_router(v1)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES)  # only when the client accepts gzip
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app
