"""The one place domain errors become HTTP statuses. Every error body is {"error", "reason"}."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.limits import PayloadTooLarge, RateLimited
from core.errors import Conflict, Forbidden, InvalidInput, NotFound, TrustfabricError, Unauthenticated

log = logging.getLogger("trustfabric.api")

STATUS_BY_ERROR: list[tuple[type[TrustfabricError], int]] = [
    (RateLimited, 429),
    (PayloadTooLarge, 413),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (InvalidInput, 400),
]


def _code(exc: BaseException) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def status_for(exc: TrustfabricError) -> int:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 400


def error_body(code: str, reason: str, **extra: object) -> dict[str, object]:
    return {"error": code, "reason": reason, **extra}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TrustfabricError)
    async def _domain(_request: Request, exc: TrustfabricError) -> JSONResponse:
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(exc.retry_after)}
        return JSONResponse(error_body(_code(exc), str(exc)), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))} for e in exc.errors()
        ]
        first = problems[0] if problems else {"loc": [], "msg": "invalid request"}
        reason = f"{'.'.join(first['loc'])}: {first['msg']}" if first["loc"] else str(first["msg"])
        return JSONResponse(error_body("invalid_request", reason, problems=problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body("http_error", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Fail closed and say little: the details go to the server log, not to the caller.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal_error", "internal error; see server log"), status_code=500)
