"""Who am I, and API tokens (admin): mint, list, revoke. `trustfabric token create` mints locally too."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from api.authz import authorize
from api.deps import CtxDep, PrincipalDep
from api.handoff import HandedOffRoute
from api.routes.common import decode_cursor, encode_cursor, request_id
from api.schemas import (
    COMMON_ERRORS,
    CursorQuery,
    LimitQuery,
    Page,
    ReasonBody,
    TokenCreate,
    TokenCreated,
    TokenOut,
    WhoAmI,
    error_responses,
)
from core.clock import as_utc
from pki.tokens import service as tokens
from pki.tokens.models import ApiToken

router = APIRouter(prefix="/v1", tags=["principals"], route_class=HandedOffRoute)

TokenId = Annotated[str, Path(min_length=1, max_length=64)]


def token_out(row: ApiToken) -> TokenOut:
    return TokenOut(
        id=row.id, role=row.role, tenant=row.tenant, subject=row.subject, created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at) if row.expires_at else None,
        revoked_at=as_utc(row.revoked_at) if row.revoked_at else None,
    )


@router.get("/whoami", response_model=WhoAmI, responses=error_responses(401, 429), summary="The caller")
def whoami(principal: PrincipalDep) -> WhoAmI:
    return WhoAmI(id=principal.id, role=principal.role, tenant=principal.tenant, auth=principal.auth)


@router.post("/tokens", status_code=201, response_model=TokenCreated,
             responses=error_responses(*COMMON_ERRORS, 404), summary="Mint an API token (admin)")
def create_token(body: TokenCreate, request: Request, ctx: CtxDep, principal: PrincipalDep) -> TokenCreated:
    authorize(request, principal, "token.create", None)
    from datetime import timedelta

    with ctx.db.session() as session:
        token, row = tokens.mint_token(
            session, ctx.keystore, role=body.role, tenant=body.tenant, ttl=timedelta(seconds=body.ttl_seconds),
            actor=principal.actor(), issuer=ctx.settings.api_issuer, audience=ctx.settings.api_audience,
            max_ttl=ctx.settings.max_token_ttl, subject=body.subject, description=body.description,
            clock=ctx.clock, request_id=request_id(request),
        )
        return TokenCreated(token=token, info=token_out(row))


@router.get("/tokens", response_model=Page[TokenOut], responses=error_responses(*COMMON_ERRORS),
            summary="List API tokens (admin; never the secrets)")
def list_tokens(request: Request, ctx: CtxDep, principal: PrincipalDep,
                cursor: CursorQuery = None, limit: LimitQuery = 50) -> Page[TokenOut]:
    authorize(request, principal, "token.read", None)
    with ctx.db.read_session() as session:
        rows = tokens.list_tokens(session, after=decode_cursor(cursor) if cursor is not None else None, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[TokenOut](items=[token_out(r) for r in rows], next_cursor=encode_cursor(rows[-1].id) if more else None)


@router.get("/tokens/{token_id}", response_model=TokenOut, responses=error_responses(*COMMON_ERRORS, 404),
            summary="One API token (admin; never the secret)")
def get_token(token_id: TokenId, request: Request, ctx: CtxDep, principal: PrincipalDep) -> TokenOut:
    authorize(request, principal, "token.read", None)
    with ctx.db.read_session() as session:
        return token_out(tokens.require_token(session, token_id))


@router.post("/tokens/{token_id}/revoke", response_model=TokenOut,
             responses=error_responses(*COMMON_ERRORS, 404, 409), summary="Revoke an API token (admin)")
def revoke(token_id: TokenId, body: ReasonBody, request: Request, ctx: CtxDep, principal: PrincipalDep) -> TokenOut:
    authorize(request, principal, "token.revoke", None)
    with ctx.db.session() as session:
        return token_out(tokens.revoke_token(session, token_id, actor=principal.actor(), reason=body.reason,
                                      clock=ctx.clock))
