"""Who did it: every audit event names its actor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ActorKind = Literal["admin", "security", "tenant", "auditor", "node", "workload", "system"]
ACTOR_KINDS: frozenset[str] = frozenset(["admin", "security", "tenant", "auditor", "node", "workload", "system"])


@dataclass(frozen=True)
class Actor:
    id: str
    kind: ActorKind

    @classmethod
    def system(cls, component: str = "trustfabric") -> Actor:
        return cls(id=component, kind="system")
