"""Inventory errors: typed so api/ maps them to 404/409/400 in one place."""

from __future__ import annotations

from core.errors import Conflict, InvalidInput, NotFound


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
