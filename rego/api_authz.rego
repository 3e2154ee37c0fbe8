# Which role may perform which action, in which tenant scope.
#
# input: {"principal": {"id", "role", "tenant"?}, "action": "grant.create", "resource": {"tenant"?}}
# The tenant scope comes from the authenticated principal: for the tenant roles,
# input.principal.tenant must equal input.resource.tenant; the request body never widens it.
package api_authz

tenant_roles := {"tenant-admin", "tenant-member"}

# role -> the actions it may perform; "*" is every action.
permissions := {
	"admin": {"*"},
	"security": {
		"policy.read", "policy.validate", "policy.test", "policy.upload", "policy.impact",
		"policy.activate", "policy.rollback", "policy.explain", "decision.read",
		"grant.read", "grant.approve", "grant.reject", "grant.revoke",
		"tenant.read", "tenant.quarantine", "tenant.unquarantine", "group.quarantine", "group.unquarantine",
		"inventory.read", "svid.read", "svid.revoke", "audit.read", "ca.read",
		"fabric.read", "placement.read", "device.read",
	},
	"tenant-admin": {
		"grant.create", "grant.read", "grant.approve", "grant.reject", "grant.revoke",
		"svid.issue", "svid.read", "svid.revoke", "inventory.read", "inventory.write",
		"tenant.read", "policy.explain", "audit.read", "decision.read",
	},
	"tenant-member": {"grant.create", "grant.read", "svid.read", "inventory.read", "tenant.read", "policy.explain"},
	"auditor": {
		"audit.read", "audit.export", "audit.verify", "policy.read", "decision.read",
		"grant.read", "tenant.read", "inventory.read", "fabric.read", "placement.read", "device.read",
	},
	# a node's device and placement reads are confined to its own node by the route (api/routes/devices.py)
	"node": {
		"svid.issue", "node.attest", "bundle.read", "policy.query", "revocation.read",
		"device.read", "device.report", "placement.read",
	},
}

role := input.principal.role

action := input.action

role_permits if "*" in permissions[role]

role_permits if action in permissions[role]

in_scope if not role in tenant_roles

in_scope if {
	role in tenant_roles
	is_string(input.principal.tenant)
	input.principal.tenant != ""
	input.principal.tenant == input.resource.tenant
}

default allow := false

allow if {
	is_string(input.principal.id)
	role_permits
	in_scope
}

reasons contains sprintf("role %s may %s", [role, action]) if allow

reasons contains sprintf("in tenant %s", [input.principal.tenant]) if {
	allow
	role in tenant_roles
}

reasons contains "unauthenticated: no principal id" if not is_string(input.principal.id)

reasons contains sprintf("unknown-role: %v", [role]) if not permissions[role]

reasons contains sprintf("not-permitted: role %s may not %v", [role, action]) if {
	permissions[role]
	not role_permits
}

reasons contains sprintf("out-of-scope: %s is scoped to tenant %v, resource is in tenant %v", [role, object.get(input.principal, "tenant", null), input.resource.tenant]) if {
	role in tenant_roles
	not in_scope
	is_string(input.resource.tenant)
}

# a platform-wide resource (the tenant list, the fabric, the CA): no tenant role reaches it
reasons contains sprintf("out-of-scope: %s is scoped to tenant %v, the resource is platform-wide (in no tenant)", [role, object.get(input.principal, "tenant", null)]) if {
	role in tenant_roles
	not in_scope
	not is_string(input.resource.tenant)
}

decision := {"allow": allow, "reasons": sort(reasons)}
