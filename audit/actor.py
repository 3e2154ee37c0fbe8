"""Who did it: every audit event names its actor.

An actor is (id, kind) and, for a principal confined to a tenant (kinds `tenant` and `workload`), that tenant:
ids are not unique across tenants (API token subjects are free text, so acme's and globex's `alice` are both
`alice`), the pair is. Platform roles, nodes and the system itself belong to no tenant.

In the hashed event the tenant is `actor.tenant`, present only when there is one: an actor without a tenant
hashes exactly as every event written before actors named their tenant, so those keep their bytes and verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ActorKind = Literal["admin", "security", "tenant", "auditor", "node", "workload", "system"]
ACTOR_KINDS: frozenset[str] = frozenset(["admin", "security", "tenant", "auditor", "node", "workload", "system"])
TENANT_KINDS: frozenset[str] = frozenset(["tenant", "workload"])  # the kinds that always carry a tenant


@dataclass(frozen=True)
class Actor:
    id: str
    kind: ActorKind
    tenant: str | None = None  # the tenant of a tenant-scoped principal (TENANT_KINDS), else None

    @classmethod
    def system(cls, component: str = "trustfabric") -> Actor:
        return cls(id=component, kind="system")


def actor_document(actor_id: str, kind: str, tenant: str | None) -> dict[str, str]:
    """An event's `actor` object: id, kind and (only when it has one) the tenant. Omitted, not null, when there is
    none: the canonical bytes of an event without it are those written before actors named their tenant."""
    doc = {"id": actor_id, "kind": kind}
    if tenant is not None:
        doc["tenant"] = tenant
    return doc


def qualified_id(actor_id: str, tenant: str | None) -> str:
    """`alice@acme` for acme's alice, the id alone for an actor of no tenant: how the log shows an actor."""
    return f"{actor_id}@{tenant}" if tenant is not None else actor_id


def requester_label(actor_id: str, tenant: str | None) -> str:
    """A grant's requester for people: `alice@acme`, or `alice (platform role)` for a platform role (tenant None
    or ''; never `alice@platform`, which is tenant platform's alice)."""
    return qualified_id(actor_id, tenant) if tenant else f"{actor_id} (platform role)"
