"""Root of every package's error hierarchy; api/ maps the subclasses to HTTP status codes in one place."""

from __future__ import annotations


class TrustfabricError(Exception):
    """A failure a person can act on; the message says what is wrong and, where possible, what to do."""


class InvalidInput(TrustfabricError):
    """The caller sent something malformed or out of bounds (HTTP 400/422)."""


class NotFound(TrustfabricError):
    """The object does not exist, or the caller may not know that it does (HTTP 404)."""


class Conflict(TrustfabricError):
    """The request contradicts current state: duplicate, wrong lifecycle state (HTTP 409)."""


class Forbidden(TrustfabricError):
    """Authenticated, but not allowed to do this (HTTP 403)."""


class Unauthenticated(TrustfabricError):
    """No valid credentials (HTTP 401)."""
