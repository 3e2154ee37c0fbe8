"""What every console page shares: the signed-in session, rendering, redirects, and errors as pages."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.console.client import Api, ApiError
from api.console.session import (
    PATH,
    SESSION_COOKIE,
    Me,
    api_for,
    clear_cookie,
    csrf_ok,
    csrf_token,
    whoami,
)
from api.errors import validation_reason
from audit.actor import qualified_id, requester_label

TEMPLATES = Path(__file__).resolve().parent / "templates"
HOME = {"tenant-admin": "tenant", "tenant-member": "tenant", "security": "/console/policy",
        "auditor": "/console/audit", "admin": "/console/policy"}
NOTICES = {
    "requested": "Grant requested.", "approved": "Approved.", "rejected": "Rejected.", "revoked": "Revoked.",
    "uploaded": "Policy version uploaded.", "activated": "Policy version activated.",
    "rolled-back": "Rolled back.", "quarantined": "Quarantined.", "released": "Quarantine lifted.",
    "identity-revoked": "Identities revoked.", "signed-out": "Signed out.",
}

env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]), trim_blocks=True,
                  lstrip_blocks=True)


def _when(value: Any) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM:SS UTC' (the API answers in UTC)."""
    if not value:
        return ""
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: Any) -> str:
    """A TTL as the request form names it: '1 hour', '8 hours', '3 days'; another TTL in the same words, its
    largest units first ('1 day 2 hours', '90 seconds' stays '1 minute 30 seconds')."""
    try:
        left = int(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts) or "0 seconds"


def requester(grant: Any) -> str:
    """Who requested a grant: `alice@acme`, or `alice (platform role)` (never `alice@platform`: that is tenant
    platform's alice); the id alone may be either (API token subjects are free text)."""
    return requester_label(str(grant.get("requested_by")), grant.get("requester_tenant"))


def actor_name(actor: Any) -> str:
    """An audit event's actor as the log shows it: `alice@acme` for acme's alice, the id alone for an actor of no
    tenant (a platform role, a node, the system, and every actor of an event from before actors named theirs)."""
    return qualified_id(str(actor.get("id")), actor.get("tenant"))


env.filters["when"] = _when
env.filters["actor"] = actor_name
env.filters["duration"] = duration
env.filters["requester"] = requester
env.filters["q"] = lambda v: urllib.parse.quote(str(v), safe="")


class NeedSignIn(Exception):
    """No session, or the API no longer accepts it."""


class CsrfRefused(Exception):
    """A state change without this session's CSRF token, or from another origin."""


@dataclass
class Session:
    token: str
    me: Me
    api: Api

    @property
    def csrf(self) -> str:
        return csrf_token(self.token)

    @property
    def home(self) -> str:
        target = HOME.get(self.me.role, "/console/audit")
        return f"/console/tenants/{self.me.tenant}" if target == "tenant" else target


async def signed_in(request: Request, *, csrf: str | None = None, change: bool = False) -> Session:
    """The session of this request, checked by the API itself (whoami); with `change`, also its CSRF token."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise NeedSignIn()
    if change and not csrf_ok(request, token, csrf):
        raise CsrfRefused()
    try:
        me = await whoami(request, token)
    except ApiError as exc:
        if exc.status == 401:
            raise NeedSignIn() from None
        raise
    return Session(token, me, api_for(request, token))


def seg(value: str) -> str:
    """One path segment of an API URL, quoted: a value from the browser never reshapes the API path."""
    return urllib.parse.quote(value, safe="")


def render(request: Request, session: Session | None, template: str, status: int = 200, **values: Any) -> Response:
    notice = NOTICES.get(request.query_params.get("notice", ""))
    page = env.get_template(template).render(
        request=request, session=session, me=session.me if session else None, csrf=session.csrf if session else "",
        notice=notice, fragment=request.headers.get("hx-request") == "true", **values,
    )
    return HTMLResponse(page, status_code=status)


def safe_next(target: str | None) -> str | None:
    """A post-sign-in destination only within the console (never another site)."""
    if target and target.startswith(PATH + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return None


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def error_page(request: Request, session: Session | None, status: int, reason: str) -> Response:
    return render(request, session, "error.html", status=status, error_status=status, reason=reason)


@lru_cache(maxsize=256)
def refused_page(status: int, reason: str, fragment: bool) -> bytes:
    """The error page of a request refused before it reached a page (the per-address rate limit: api/limits.py),
    without the session, which that refusal never reads: the page's frame, no navigation. Cached: a flood from
    one address asks for the same few pages."""
    return env.get_template("error.html").render(
        request=None, session=None, me=None, csrf="", notice=None, fragment=fragment, error_status=status,
        reason=reason).encode()


async def on_need_sign_in(request: Request, _exc: Exception) -> Response:
    target = "/console/login"
    if request.method == "GET" and request.url.path != PATH + "/":
        target += "?" + urllib.parse.urlencode({"next": request.url.path})
    if request.headers.get("hx-request") == "true":
        response: Response = Response(status_code=204, headers={"HX-Redirect": target})
    else:
        response = see_other(target)
    clear_cookie(response, request, SESSION_COOKIE)
    return response


async def on_csrf_refused(request: Request, _exc: Exception) -> Response:
    return error_page(request, None, 403, "This form is stale or came from another site (CSRF check failed). "
                      "Reload the page and try again.")


async def _session_if_any(request: Request) -> Session | None:
    """The request's session for the error page's navigation, None without a live one."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        try:
            return Session(token, await whoami(request, token), api_for(request, token))
        except ApiError:
            return None
    return None


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status == 401:
        return await on_need_sign_in(request, exc)
    return error_page(request, await _session_if_any(request), exc.status, exc.reason)


async def on_invalid_form(request: Request, exc: RequestValidationError) -> Response:
    """A form or query the page's own controls cannot send (a tampered TTL, a word for a number): refused before
    the page ran, so nothing was written; shown as the console's error page, after sign-in as any page is."""
    session = await _session_if_any(request)
    if session is None:
        return await on_need_sign_in(request, exc)
    loc, _problems = validation_reason(exc)
    field, _, problem = loc.partition(": ")
    name = field.rsplit(".", 1)[-1]
    return error_page(request, session, 422, f"The form's field {name!r} was refused: {problem or loc}. "
                      "Reload the page and use its controls.")
