"""The one place errors become HTTP answers. Every body is {"error", "reason"}; the status is the one the
error class carries (core/errors.py). Server-side failures -- an unmapped error, an exception -- are 500
and logged with the request id, which the answer names so a person can find the log line; a dependency
that is down (OPA server, PKCS#11 token, database) is 503 with its name."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, PendingRollbackError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.deps import AUTHENTICATED_IN_THREAD, authenticate
from api.patterns import pattern_words
from api.routes.common import request_id
from api.workers import in_worker
from core.errors import RateLimited, TrustfabricError

log = logging.getLogger("trustfabric.api")


def error_code(exc: BaseException) -> str:
    """The `error` field of an answer: the error class's name in snake case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


_code = error_code


def status_for(exc: TrustfabricError) -> int:
    """The HTTP status an error means (the class's own; 500 for one that names none)."""
    return exc.http_status


def error_body(code: str, reason: str, **extra: object) -> dict[str, object]:
    return {"error": code, "reason": reason, **extra}


def problem_message(error: dict[str, Any]) -> str:
    """One problem of a refused request in words: a value a pattern refused says what the field must be
    (api/patterns.py: 'tenant must be 1-63 lowercase letters, ...'), never the regular expression; pydantic's own
    message otherwise."""
    if error.get("type") == "string_pattern_mismatch":
        names = [part for part in error.get("loc", ()) if isinstance(part, str)]
        pattern = (error.get("ctx") or {}).get("pattern")
        words = pattern_words(names[-1] if names else "the value", str(pattern))
        if words is not None:
            return words
    return str(error.get("msg", ""))


def validation_reason(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    """(the first problem as one line, 'path.tenant: tenant must be ...', every problem as {loc, msg})."""
    problems: list[dict[str, Any]] = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": problem_message(e)} for e in exc.errors()
    ]
    first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
    return (f"{'.'.join(first['loc'])}: {first['msg']}" if first["loc"] else str(first["msg"])), problems


def _internal(request: Request, exc: BaseException) -> JSONResponse:
    # Fail closed and say little: the details go to the server log, under the request id.
    rid = request_id(request)
    log.error("unhandled error on %s %s (request id %s)", request.method, request.url.path, rid, exc_info=exc)
    return JSONResponse(
        error_body("internal_error", f"internal error; see the server log for request id {rid}", request_id=rid),
        status_code=500, headers={"X-Request-ID": rid},
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TrustfabricError)
    async def _domain(request: Request, exc: TrustfabricError) -> JSONResponse:
        status = status_for(exc)
        if status == 500:
            return _internal(request, exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(exc.retry_after)}
        if status == 503:
            rid = request_id(request)
            log.warning("unavailable on %s %s (request id %s): %s", request.method, request.url.path, rid, exc)
            headers = {"Retry-After": "5", "X-Request-ID": rid}
        return JSONResponse(error_body(_code(exc), str(exc)), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.scope.get("endpoint") in AUTHENTICATED_IN_THREAD:
            # its token was not checked yet: refused for that first (off the loop: the check reads the database)
            try:
                await in_worker(request, authenticate, request, request.app.state.ctx)
            except TrustfabricError as refused:
                return await _domain(request, refused)
        reason, problems = validation_reason(exc)
        return JSONResponse(error_body("invalid_request", reason, problems=problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body("http_error", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database(request: Request, exc: Exception) -> JSONResponse:
        # The database refused the connection or the statement (down, locked past the busy timeout).
        rid = request_id(request)
        log.warning("database unavailable on %s %s (request id %s): %s", request.method, request.url.path, rid,
                    str(exc).splitlines()[0][:300])
        return JSONResponse(
            error_body("unavailable", f"the database is unavailable; retry shortly (request id {rid})"),
            status_code=503, headers={"Retry-After": "5", "X-Request-ID": rid},
        )

    @app.exception_handler(PendingRollbackError)
    async def _lost_connection(request: Request, exc: PendingRollbackError) -> JSONResponse:
        # The connection was lost inside the transaction and an earlier failure was handled on the way: the
        # database went away (503, as above); any other pending rollback is a bug (500).
        if "reconnect" not in str(exc):
            return _internal(request, exc)
        return await _database(request, exc)

    @app.exception_handler(IntegrityError)
    async def _conflict(request: Request, exc: IntegrityError) -> JSONResponse:
        # A concurrent request (maybe on another replica) committed the same key, or removed a row this one
        # refers to, between this request's checks and its commit: the transaction was rolled back whole.
        log.info("concurrent conflict on %s %s (request id %s): %s", request.method, request.url.path,
                 request_id(request), str(exc.orig).splitlines()[0][:300] if exc.orig else "")
        return JSONResponse(
            error_body("conflict", "a concurrent change conflicts with this request (the same name was created, "
                       "or something it refers to changed); nothing was written: read the current state and retry"),
            status_code=409)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _internal(request, exc)
