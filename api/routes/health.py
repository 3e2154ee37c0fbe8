"""Liveness: no authentication, no secrets."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import CtxDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(ctx: CtxDep) -> dict[str, str]:
    with ctx.db.read_session() as session:
        session.connection().execute(text("SELECT 1"))
    return {"status": "ok"}
