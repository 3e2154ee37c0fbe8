"""GET /metrics: Prometheus text format (api/metrics.py). Authenticated: the dedicated metrics token
(TRUSTFABRIC_METRICS_TOKEN) or a principal with role admin or security; not in the OpenAPI document (it is
not JSON)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.deps import CtxDep, authenticate
from api.metrics import CONTENT_TYPE, exposition, metrics_token_ok
from api.workers import in_worker
from core.errors import Forbidden
from workflows.context import AppContext

router = APIRouter(include_in_schema=False)
ROLES = ("admin", "security")


@router.get("/metrics")
async def metrics(request: Request, ctx: CtxDep) -> Response:
    # one hand-off: the caller checked (a principal's token is a database read) and the exposition built off the loop
    return Response(await in_worker(request, _exposition_for, request, ctx), media_type=CONTENT_TYPE)


def _exposition_for(request: Request, ctx: AppContext) -> bytes:
    if not metrics_token_ok(ctx, request.headers.get("authorization")):
        principal = authenticate(request, ctx)
        if principal.role not in ROLES:
            raise Forbidden(f"role {principal.role!r} may not read metrics (needs {' or '.join(ROLES)}, or the "
                            "metrics token)")
    return exposition(ctx)
