"""Sign-in (API token, or the OIDC issuer), sign-out, and the role's home page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response

from api.console import oidc
from api.console.session import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SignInError,
    clear_cookie,
    ctx_of,
    end_session,
    login_token_ok,
    new_login_token,
    set_cookie,
    start_session,
)
from api.console.web import CsrfRefused, NeedSignIn, render, safe_next, see_other, signed_in

router = APIRouter()
LOGIN_SECONDS = 1800


def _login_page(request: Request, error: str | None = None, status: int = 200, next_url: str | None = None
                ) -> Response:
    token = new_login_token()
    response = render(request, None, "login.html", status=status, error=error, login_token=token,
                      oidc=oidc.enabled(ctx_of(request).settings), next_url=safe_next(next_url) or "")
    set_cookie(response, request, LOGIN_COOKIE, token, LOGIN_SECONDS)
    return response


def _signed_in_response(request: Request, token: str, seconds: int, target: str, *, via_page: bool) -> Response:
    """Set the session cookie and go on. After the OIDC callback the next page is reached through a page of
    ours (a meta refresh), since a SameSite=Strict cookie is not sent on a redirect that began cross-site."""
    response = render(request, None, "continue.html", target=target) if via_page else see_other(target)
    set_cookie(response, request, SESSION_COOKIE, token, seconds)
    clear_cookie(response, request, LOGIN_COOKIE)
    return response


@router.get("/")
async def home(request: Request) -> Response:
    try:
        session = await signed_in(request)
    except NeedSignIn:
        return see_other("/console/login")
    return see_other(session.home)


@router.get("/login")
async def login_form(request: Request, next: Annotated[str | None, Query(max_length=300)] = None) -> Response:
    return _login_page(request, next_url=next)


@router.post("/login")
async def login(request: Request, token: Annotated[str, Form(max_length=8192)] = "",
                login_token: Annotated[str, Form(max_length=100)] = "",
                next: Annotated[str, Form(max_length=300)] = "") -> Response:
    if not login_token_ok(request, login_token):
        return _login_page(request, "This sign-in form is stale or came from another site: try again.", 403)
    try:
        session_token, me, expires_at = await start_session(request, token)
    except SignInError as exc:
        return _login_page(request, str(exc), 401, next)
    seconds = int((expires_at - ctx_of(request).clock()).total_seconds())
    home = safe_next(next) or (f"/console/tenants/{me.tenant}" if me.scope_tenant else "/console/")
    return _signed_in_response(request, session_token, seconds, home, via_page=False)


@router.get("/oidc/start")
async def oidc_start(request: Request) -> Response:
    if not oidc.enabled(ctx_of(request).settings):
        return _login_page(request, "OIDC sign-in is not configured on this server.", 404)
    try:
        return await oidc.start(request)
    except SignInError as exc:
        return _login_page(request, str(exc), 502)


@router.get("/oidc/callback")
async def oidc_callback(
    request: Request, code: Annotated[str | None, Query(max_length=2048)] = None,
    state: Annotated[str | None, Query(max_length=512)] = None,
    error: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    try:
        access_token = await oidc.finish(request, code, state, error)
        session_token, _me, expires_at = await start_session(request, access_token)
    except SignInError as exc:
        response = _login_page(request, str(exc), 401)
        oidc.forget_flow(response, request)
        return response
    seconds = int((expires_at - ctx_of(request).clock()).total_seconds())
    response = _signed_in_response(request, session_token, seconds, "/console/", via_page=True)
    oidc.forget_flow(response, request)
    return response


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    try:
        session = await signed_in(request, csrf=csrf, change=True)
    except NeedSignIn:
        session = None
    except CsrfRefused:
        raise
    if session is not None:
        await end_session(request, session.token)
    response = see_other("/console/login?notice=signed-out")
    clear_cookie(response, request, SESSION_COOKIE)
    return response
