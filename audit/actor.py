"""Who did it: every audit event names its actor.

An actor is (id, kind) and, for a principal confined to a tenant (kinds `tenant` and `workload`), that tenant:
ids are not unique across tenants (API token subjects are free text, so acme's and globex's `alice` are both
`alice`), the pair is. Platform roles, nodes and the system itself belong to no tenant.

In the hashed event the tenant is `actor.tenant`, present only when there is one: an actor without a tenant
hashes exactly as every event written before actors named their tenant, so those keep their bytes and verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal, NamedTuple

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


ACTOR_QUERY_MAX = 576  # an id (512) @ a tenant (63)


class ActorMatch(NamedTuple):
    """One shape of actor an ActorQuery selects: this id (None: any) of this tenant (None: of no tenant), or of any
    tenant and of none (`any_tenant`)."""

    id: str | None
    tenant: str | None
    any_tenant: bool = False


@dataclass(frozen=True)
class ActorQuery:
    """Which actors' events to select, as the log shows actors (`qualified_id`): the one definition that `audit
    events` (the SQL of audit.service.actor_filter), an export's selection and the offline verifier read.

    - `alice@acme` (an id, `@`, a tenant slug): acme's alice only -- and an actor of no tenant whose id is
      `alice@acme` itself (a platform principal so named, or an event from before actors named their tenant);
    - `alice` (no tenant part): alice of every tenant and of none, as before actors named their tenant;
    - with `actor_tenant`: `actor` is the bare id (`alice`, or a subject that itself holds an `@`) within that
      tenant; `actor_tenant` alone: every actor of that tenant.

    Events from before actors named their tenant have none: a tenant's `alice` among them matches `alice`, never
    `alice@acme` (whose she was is not in the log)."""

    actor: str | None = None
    actor_tenant: str | None = None

    @property
    def given(self) -> bool:
        return self.actor is not None or self.actor_tenant is not None

    def problem(self) -> str | None:
        """Why this is no actor filter (None when it is one): each caller raises its own error with it."""
        from core.slugs import is_slug

        if self.actor_tenant is not None and (not isinstance(self.actor_tenant, str) or not is_slug(self.actor_tenant)):
            return f"actor tenant {self.actor_tenant!r:.80} is not a DNS-label slug"
        if self.actor is not None and (not isinstance(self.actor, str)
                                       or not 1 <= len(self.actor) <= ACTOR_QUERY_MAX):
            return f"actor {self.actor!r:.80} is not an actor id (1-{ACTOR_QUERY_MAX} characters, e.g. alice@acme)"
        if not self.given:
            return "an actor filter names an actor or an actor tenant"
        return None

    @cached_property
    def alternatives(self) -> tuple[ActorMatch, ...]:
        """The shapes of actor selected (any one matches), worked out once; read on a query without a problem()."""
        from core.slugs import is_slug

        if self.actor_tenant is not None:
            return (ActorMatch(self.actor, self.actor_tenant),)
        actor = self.actor or ""
        name, at, tenant = actor.rpartition("@")
        if at and name and is_slug(tenant):
            return ActorMatch(name, tenant), ActorMatch(actor, None)
        return (ActorMatch(actor, None, any_tenant=True),)

    def matches(self, actor_id: str, tenant: str | None) -> bool:
        """Whether the actor (id, tenant or None) of an event is one this query selects."""
        return any((m.id is None or m.id == actor_id) and (m.any_tenant or m.tenant == tenant)
                   for m in self.alternatives)

    def as_json(self) -> dict[str, str]:
        """The query's given parts (an export header's `filter` names only these: an export without them reads as
        every export before actor filters existed)."""
        return {k: v for k, v in (("actor", self.actor), ("actor_tenant", self.actor_tenant)) if v is not None}
