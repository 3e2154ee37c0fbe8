"""Opaque bearer tokens (`tfo_...`, the admin bootstrap token made by init): one indexed lookup of the
secret's hash (pki/tokens holds the rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from api.auth.bearer import bearer_token
from api.principal import Principal
from pki.tokens.service import TOKEN_PREFIX, opaque_token

if TYPE_CHECKING:
    from workflows.context import AppContext


def opaque_token_authenticator(ctx: AppContext, request: Request) -> Principal | None:
    token = bearer_token(request)
    if token is None or not token.startswith(TOKEN_PREFIX):
        return None
    with ctx.db.read_session() as session:
        row = opaque_token(session, token, ctx.clock)
    return Principal(id=row.subject, role=row.role, tenant=row.tenant, auth="token")  # type: ignore[arg-type]
