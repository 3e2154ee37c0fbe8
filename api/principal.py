"""The authenticated caller. Tenant scope always comes from here, never from a path or a body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from audit import Actor
from audit.actor import ActorKind

Role = Literal["admin", "security", "tenant-admin", "tenant-member", "auditor", "node", "workload"]
ROLES: tuple[str, ...] = ("admin", "security", "tenant-admin", "tenant-member", "auditor", "node", "workload")
TENANT_ROLES = frozenset({"tenant-admin", "tenant-member", "workload"})

_ACTOR_KIND: dict[str, ActorKind] = {
    "admin": "admin",
    "security": "security",
    "tenant-admin": "tenant",
    "tenant-member": "tenant",
    "auditor": "auditor",
    "node": "node",
    "workload": "workload",
}


@dataclass(frozen=True)
class Principal:
    id: str
    role: Role
    tenant: str | None = None
    auth: str = "token"  # token | jwt | jwt-svid | mtls

    @property
    def scope_tenant(self) -> str | None:
        """The tenant this principal is confined to, or None for platform roles."""
        return self.tenant if self.role in TENANT_ROLES else None

    def actor(self) -> Actor:
        return Actor(id=self.id, kind=_ACTOR_KIND[self.role])
