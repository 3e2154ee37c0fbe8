"""Answers that may take seconds to compute at scale (the impact report, the flow set after a change):
a client that sends `Prefer: respond-async` (RFC 7240) is answered 202 with `Retry-After` while the
computation runs in the background, and asks again; without it, the route waits as it always did (the
CLI, scripts). The 202 never carries a previous result: a stale answer is never presented as current.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

RETRY_AFTER_SECONDS = 1


class ComputingOut(BaseModel):
    state: str = Field("computing", description="always `computing`: nothing is answered until it is current")
    retry_after_seconds: int = Field(RETRY_AFTER_SECONDS, description="ask again after this many seconds")


COMPUTING_RESPONSE: dict[int | str, dict[str, Any]] = {
    202: {"model": ComputingOut, "description": "with `Prefer: respond-async` only: being computed, ask again "
                                                "after Retry-After seconds"}}


def prefers_async(request: Request) -> bool:
    """Whether the client asked for an answer at once (RFC 7240 `Prefer: respond-async`)."""
    return any(token.split(";", 1)[0].strip().lower() == "respond-async"
               for value in request.headers.getlist("prefer") for token in value.split(","))


def computing() -> JSONResponse:
    return JSONResponse(ComputingOut().model_dump(), status_code=202,
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Preference-Applied": "respond-async"})
