"""What the control-plane routes share: request ids, cursors, the caller for services."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request

from api.principal import Principal
from inventory.errors import Quarantined
from pki.errors import NotPlacedOnNode
from policy.grants import Caller, GrantDecider, GrantDecision, decode_cursor, encode_cursor
from workflows.context import AppContext

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

__all__ = ["caller_of", "decode_cursor", "denial_logged", "encode_cursor", "grant_decider", "log_denial", "request_id"]


def request_id(request: Request) -> str:
    """The caller's X-Request-ID when it is sane, else a fresh one; the same for the whole request (it is
    written into audit events and named in the log and the answer of a server-side failure)."""
    known: str | None = getattr(request.state, "request_id", None)
    if known is not None:
        return known
    given = request.headers.get("x-request-id")
    rid = given if given and _REQUEST_ID_RE.fullmatch(given) else secrets.token_hex(8)
    request.state.request_id = rid
    return rid


def caller_of(principal: Principal) -> Caller:
    return Caller(id=principal.id, role=principal.role, tenant=principal.scope_tenant, actor=principal.actor())


@contextmanager
def denial_logged(ctx: AppContext, principal: Principal, action: str, resource: dict[str, Any]) -> Iterator[None]:
    """A refusal because the tenant or group is quarantined, or because a node asked for a workload not placed
    on it (issue 13 item 1), is written to the decision log (kind `authz`, where denials are logged) of the
    principal that asked, in its own transaction after the request's own rolled back; then it propagates
    (403 with the reason)."""
    try:
        yield
    except (Quarantined, NotPlacedOnNode) as exc:
        log_denial(ctx, principal, action, resource, exc)
        raise


def log_denial(ctx: AppContext, principal: Principal, action: str, resource: dict[str, Any],
               exc: BaseException) -> None:
    """What denial_logged writes for a refusal (a quarantine, a workload not on the asking node); nothing for any
    other error. For a route that answers such a refusal without raising it (one entry of a batch)."""
    if not isinstance(exc, Quarantined | NotPlacedOnNode):
        return
    from policy.decide import AuthzDecision
    from policy.decisionlog import DecisionLog

    reason = f"quarantined: {exc}" if isinstance(exc, Quarantined) else str(exc)
    asked = {"principal": {"id": principal.id, "role": principal.role, "tenant": principal.tenant},
             "action": action, "resource": resource}
    DecisionLog(ctx.db, clock=ctx.clock).record(
        "authz", asked, AuthzDecision(False, [reason]), None, owner=principal.scope_tenant)


def grant_decider(request: Request) -> GrantDecider:
    """The app's grant decider (policy/grant_decider.py); without one every decision fails, so it denies."""
    decider: GrantDecider | None = getattr(request.app.state, "grant_decider", None)
    if decider is None:
        def _deny(*_args: object) -> GrantDecision:
            raise RuntimeError("no grant policy configured")

        return _deny
    return decider
