"""Inventory errors: typed so api/ maps them to 404/409/400 in one place."""

from __future__ import annotations

from core.errors import Conflict, Forbidden, InvalidInput, NotFound


class TenantNotFound(NotFound):
    pass


class GroupNotFound(NotFound):
    pass


class WorkloadNotFound(NotFound):
    pass


class AlreadyExists(Conflict):
    pass


class InvalidInventory(InvalidInput):
    pass


class Quarantined(Forbidden):
    """The tenant or group is quarantined: it gets no identities (X.509- or JWT-SVIDs) and no new workloads
    until security lifts the quarantine (HTTP 403; the message names what is quarantined)."""
