"""Per-tenant quotas: how many workload groups, workloads, active grants and pending grant requests one
tenant may hold, so one tenant cannot grow the policy data (and every decision's cost) at the others'
expense (issue 13, item 6). Configured in workflows/settings.py; 0 means no limit. Exceeding one is a 409
that names the quota and its limit; nothing is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.errors import Conflict

QuotaName = Literal["groups", "workloads", "grants", "pending"]
_WHAT: dict[str, str] = {
    "groups": "workload groups",
    "workloads": "registered workloads",
    "grants": "active grants (as the source)",
    "pending": "pending grant requests (as the source)",
}


class QuotaExceeded(Conflict):
    """A tenant holds as many of something as its quota allows (HTTP 409, the quota named)."""

    def __init__(self, tenant: str, name: str, limit: int) -> None:
        self.tenant, self.name, self.limit = tenant, name, limit
        super().__init__(f"quota exceeded: tenant {tenant} holds {limit} {_WHAT[name]}, the limit of its "
                         f"'{name}' quota; remove some or ask the platform admin to raise it")


@dataclass(frozen=True)
class Quotas:
    groups: int = 500
    workloads: int = 10_000
    grants: int = 1_000
    pending: int = 100

    def check(self, tenant: str, name: QuotaName, held: int) -> None:
        """QuotaExceeded when `tenant`, holding `held`, may not add one more of `name`."""
        limit: int = getattr(self, name)
        if limit > 0 and held >= limit:
            raise QuotaExceeded(tenant, name, limit)


UNLIMITED = Quotas(groups=0, workloads=0, grants=0, pending=0)
