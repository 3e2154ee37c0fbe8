"""Root of every package's error hierarchy. Each class carries the HTTP status it means, so the API maps
any error in one line (api/errors.py) and a new error class needs no second edit elsewhere. A subclass
of TrustfabricError that names no status of its own is a 500: an error nobody mapped is a server fault,
never the caller's "bad input"."""

from __future__ import annotations


class TrustfabricError(Exception):
    """A failure a person can act on; the message says what is wrong and, where possible, what to do."""

    http_status: int = 500


class InvalidInput(TrustfabricError):
    """The caller sent something malformed or out of bounds (HTTP 400)."""

    http_status = 400


class Unauthenticated(TrustfabricError):
    """No valid credentials (HTTP 401)."""

    http_status = 401


class Forbidden(TrustfabricError):
    """Authenticated, but not allowed to do this (HTTP 403)."""

    http_status = 403


class NotFound(TrustfabricError):
    """The object does not exist, or the caller may not know that it does (HTTP 404)."""

    http_status = 404


class Conflict(TrustfabricError):
    """The request contradicts current state: duplicate, wrong lifecycle state (HTTP 409)."""

    http_status = 409


class PayloadTooLarge(TrustfabricError):
    """The request body is larger than the configured limit (HTTP 413)."""

    http_status = 413


class RateLimited(TrustfabricError):
    """Too many requests from one principal (HTTP 429 with Retry-After)."""

    http_status = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(TrustfabricError):
    """Something this server depends on cannot be reached or used right now: the OPA server, the PKCS#11
    token, the database (HTTP 503). Retrying later may succeed; the message names what is down."""

    http_status = 503
