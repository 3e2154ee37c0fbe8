"""The authenticated caller. Tenant scope always comes from here, never from a path or a body."""

from __future__ import annotations

from dataclasses import dataclass

from audit import Actor
from audit.actor import ActorKind, qualified_id
from core.errors import Unauthenticated
from core.slugs import is_slug
from core.vocabulary import ROLES, TENANT_ROLES, Role

__all__ = ["ROLES", "TENANT_ROLES", "Principal", "Role", "principal_from_spiffe_id"]


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

    @property
    def qualified_id(self) -> str:
        """`id@tenant` for a principal confined to a tenant, the id alone for a platform one: what tells principals
        apart, as `id` does not (API token subjects are free text, so acme's and globex's `alice` are both `alice`).
        With the role, unique: a tenant role always carries its tenant (a DNS label, no `@`), a platform role never."""
        return qualified_id(self.id, self.scope_tenant)

    def actor(self) -> Actor:
        """Who the audit log says acted: a principal confined to a tenant (tenant roles, a workload, whose tenant is
        in its SPIFFE ID) with that tenant, so acme's and globex's `alice` are two actors; a platform role or a node
        with none."""
        return Actor(id=self.id, kind=_ACTOR_KIND[self.role], tenant=self.scope_tenant)


def principal_from_spiffe_id(spiffe_id: str, trust_domain: str, auth: str) -> Principal:
    """`/node/<n>` is a node; `/tenant/<t>/group/<g>/<w>` a workload of tenant t; anything else is refused.
    The ID is parsed by pki's one SPIFFE ID parser; a malformed one is Unauthenticated, not bad input."""
    from pki.errors import InvalidSpiffeId
    from pki.spiffe_id import parse_spiffe_id

    try:
        sid = parse_spiffe_id(spiffe_id)
    except InvalidSpiffeId as exc:
        raise Unauthenticated(f"SPIFFE ID is malformed: {exc}") from None
    if sid.trust_domain != trust_domain:
        raise Unauthenticated("SPIFFE ID is not in this trust domain")
    parts = sid.segments
    if len(parts) == 2 and parts[0] == "node" and is_slug(parts[1]):
        return Principal(id=spiffe_id, role="node", tenant=None, auth=auth)
    if (len(parts) == 5 and parts[0] == "tenant" and parts[2] == "group"
            and all(is_slug(p) for p in (parts[1], parts[3], parts[4]))):
        return Principal(id=spiffe_id, role="workload", tenant=parts[1], auth=auth)
    raise Unauthenticated(f"SPIFFE ID {spiffe_id} names neither a node nor a workload")
