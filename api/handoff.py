"""Sync routes whose caller is a dependency, each run as one hand-off to a worker thread, its token check included.

A `def` route taking `principal: PrincipalDep` had FastAPI resolve the principal on the event loop (the token's row
read from the database: on PostgreSQL a round trip every connection of the replica waited through), then hand the
route to a worker thread. `HandedOffRoute`, the route class of every API router that authenticates, makes such an
endpoint an `async def` with the same parameters less the principal, which authenticates
(`api.deps.authenticate`: the principal's rate limit included) and calls the endpoint in one hand-off to the app's
worker threads (api/workers.py).
FastAPI still validates the path, query, headers and body on the loop first; a request it refuses as invalid is
authenticated first all the same (`authenticated_in_thread`, api/errors.py), so 401 (or the principal's 429) still
comes before 422.

What changes for such a route, besides where the token is read: FastAPI validates an `async def` endpoint's return
value against its response model on the loop, where it did that in a second hand-off for a `def` one (for a model
instance of the response model's class, an isinstance check). An `async def` endpoint, a generator (streamed by
FastAPI), or one without the principal among its parameters, is left as it is.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar, get_args, get_origin

from fastapi import Request, Response
from fastapi.params import Depends
from fastapi.routing import APIRoute

from api.deps import authenticate, authenticated_in_thread, current_principal, unauthenticated
from api.input_text import CheckedRequest, refuse_nul_in_url
from api.workers import in_worker
from store import carried

E = TypeVar("E", bound=Callable[..., Any])
_REQUEST = "tf_handoff_request"  # the Request parameter added to an endpoint that takes none


def _is_principal(annotation: Any) -> bool:
    """Whether a parameter's annotation is PrincipalDep (the principal as the dependency `current_principal`)."""
    if get_origin(annotation) is not Annotated:
        return False
    return any(isinstance(m, Depends) and m.dependency is current_principal for m in get_args(annotation)[1:])


def handed_off(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """`endpoint` as one hand-off that authenticates and calls it (see the module); itself when it is `async def`,
    a generator, or takes no principal."""
    if inspect.iscoroutinefunction(endpoint) or inspect.isgeneratorfunction(endpoint) \
            or inspect.isasyncgenfunction(endpoint):  # FastAPI streams a generator's items itself
        return endpoint
    hints = typing.get_type_hints(endpoint, include_extras=True)
    signature = inspect.signature(endpoint)
    principals = [name for name in signature.parameters if _is_principal(hints.get(name))]
    if not principals:
        return endpoint
    # FastAPI reads this signature, not the endpoint's: every annotation resolved here (the route modules' are
    # strings, resolved in their own namespace), every parameter keyword-only (FastAPI passes them so; it keeps
    # their order, and so the OpenAPI document's), the principal left out
    params = [p.replace(annotation=hints.get(name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
              for name, p in signature.parameters.items() if name not in principals]
    request_name = next((p.name for p in params if p.annotation is Request), _REQUEST)
    added = request_name == _REQUEST
    if added:
        params.append(inspect.Parameter(_REQUEST, inspect.Parameter.KEYWORD_ONLY, annotation=Request))

    carries = getattr(endpoint, CARRIES_CHECKS, False)

    def run(request: Request, values: dict[str, Any]) -> Any:
        ctx = request.app.state.ctx
        with ctx.db.one_connection():  # the token's row and the endpoint's first reads: one pooled connection
            if not carries:
                principal = authenticate(request, ctx)
                for name in principals:
                    values[name] = principal
                return endpoint(**values)
            with carried.carrying():
                try:
                    principal = authenticate(request, ctx)
                    for name in principals:
                        values[name] = principal
                    result = endpoint(**values)
                    carried.settle_pending()  # (the endpoint's first statement made them: nothing to do)
                    return result
                except BaseException:
                    # what a check still pending refuses comes first, as when the token's row was read before
                    # anything else: a revoked token is 401, never the 403, 409 or 429 its request would get
                    try:
                        carried.settle_pending()
                    except BaseException:
                        # the token was refused, or its check could not be made (the database gone): nobody is
                        # authenticated, and a refused token's rate-limit charge goes back to the principal it names
                        unauthenticated(request)
                        raise
                    raise

    async def route(**values: Any) -> Any:
        request = values.pop(_REQUEST) if added else values[request_name]
        return await in_worker(request, run, request, values)

    route.__name__ = endpoint.__name__  # FastAPI names the route (and its OpenAPI operationId) after it
    route.__qualname__ = endpoint.__qualname__
    route.__doc__ = endpoint.__doc__  # the operation's description
    route.__module__ = endpoint.__module__
    route.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=hints.get("return", signature.return_annotation))
    route.tf_endpoint = endpoint  # type: ignore[attr-defined]  # the sync function it runs
    return authenticated_in_thread(route)


CARRIES_CHECKS = "tf_carries_checks"


def carries_checks(endpoint: E) -> E:
    """Marks a handed-off endpoint whose first database statement carries its authentication's checks still to make
    (store/carried.py: on PostgreSQL, an API token's row, read in a grant decision's marker instead of a round trip of
    its own). The endpoint must pass `store.carried.pending()` to that statement before it acts; whatever it leaves
    pending is made before any write (store.db, store.groupcommit) and before it is answered (`handed_off`), and a
    refusal there comes before the endpoint's own error."""
    setattr(endpoint, CARRIES_CHECKS, True)
    return endpoint


class HandedOffRoute(APIRoute):
    """An APIRoute whose sync endpoint taking the principal runs as `handed_off` makes it, and whose request
    meets api/input_text.py's checks (no NUL in the URL or the JSON body, a UTF-8 body) before FastAPI reads it."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, handed_off(endpoint), **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            refuse_nul_in_url(request.scope)
            return await handler(CheckedRequest(request.scope, request.receive, request._send))

        return checked
