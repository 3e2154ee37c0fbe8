"""The project's words, defined once. Python Literals, tuples for membership checks, OpenAPI patterns and
CLI help texts all derive from the definitions here, so adding a role or a state touches one line.
"""

from __future__ import annotations

from typing import Literal, get_args

# ---- who: roles of an authenticated principal
MintableRole = Literal["admin", "security", "tenant-admin", "tenant-member", "auditor"]
Role = Literal[MintableRole, "node", "workload"]
ROLES: tuple[str, ...] = get_args(Role)
MINTABLE_ROLES: tuple[str, ...] = get_args(MintableRole)  # API tokens can carry these; nodes/workloads use SVIDs
TENANT_ROLES: frozenset[str] = frozenset({"tenant-admin", "tenant-member", "workload"})  # confined to a tenant

# ---- names: tenants and groups are DNS labels (they appear in SPIFFE IDs, VRF names, NVUE keys)
SLUG_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
SLUG_MAX = 63

# ---- audit event actions: `svid.issue`, `grant.approve` (the log, the API's filters and the CLI's check one pattern)
AUDIT_ACTION_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)+$"

# ---- grants: lifecycle states
GrantState = Literal["pending", "active", "expired", "revoked", "rejected", "denied"]
GRANT_STATES: tuple[str, ...] = get_args(GrantState)
FINAL_GRANT_STATES: tuple[str, ...] = ("expired", "revoked", "rejected", "denied")
GRANT_STATE_PATTERN = "^(" + "|".join(GRANT_STATES) + ")$"

# ---- the tenant whose groups are services offered to every tenant (rego/flows.rego: platform_tenant)
PLATFORM_TENANT = "platform"

# ---- trust domain used until `init` stores one
DEFAULT_TRUST_DOMAIN = "trustfabric.local"


def one_of(values: tuple[str, ...]) -> str:
    """'a|b|c', for CLI help texts."""
    return "|".join(values)
