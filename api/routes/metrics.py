"""GET /metrics: Prometheus text format (api/metrics.py). Authenticated: the dedicated metrics token
(TRUSTFABRIC_METRICS_TOKEN) or a principal with role admin or security; not in the OpenAPI document (it is
not JSON)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import CtxDep, current_principal
from api.metrics import CONTENT_TYPE, exposition, metrics_token_ok
from core.errors import Forbidden

router = APIRouter(include_in_schema=False)
ROLES = ("admin", "security")


@router.get("/metrics")
async def metrics(request: Request, ctx: CtxDep) -> Response:
    if not metrics_token_ok(ctx, request.headers.get("authorization")):
        principal = await current_principal(request, ctx)
        if principal.role not in ROLES:
            raise Forbidden(f"role {principal.role!r} may not read metrics (needs {' or '.join(ROLES)}, or the "
                            "metrics token)")
    return Response(await run_in_threadpool(exposition, ctx), media_type=CONTENT_TYPE)
