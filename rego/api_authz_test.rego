package api_authz_test

import data.api_authz

ask(role, tenant, action, rtenant) := r if {
	i := {"principal": {"id": "p1", "role": role, "tenant": tenant}, "action": action, "resource": {"tenant": rtenant}}
	r := {"allow": api_authz.allow, "reasons": api_authz.reasons} with input as i
}

test_admin_may_do_anything if ask("admin", null, "tenant.quarantine", "acme").allow

test_security_activates_policy if ask("security", null, "policy.activate", null).allow

test_security_cannot_issue_svid if not ask("security", null, "svid.issue", "acme").allow

test_security_reads_ca_status_but_cannot_rotate if {
	ask("security", null, "ca.read", null).allow
	not ask("security", null, "ca.rotate", null).allow
}

test_tenant_admin_in_own_tenant if {
	r := ask("tenant-admin", "acme", "grant.approve", "acme")
	r.allow
	r.reasons == {"role tenant-admin may grant.approve", "in tenant acme"}
}

test_tenant_admin_other_tenant_denied if {
	r := ask("tenant-admin", "acme", "grant.approve", "globex")
	not r.allow
	some reason in r.reasons
	startswith(reason, "out-of-scope:")
}

test_tenant_role_without_resource_tenant_denied if {
	r := ask("tenant-member", "acme", "grant.read", null)
	not r.allow
	"out-of-scope: tenant-member is scoped to tenant acme, the resource is platform-wide (in no tenant)" in r.reasons
}

test_tenant_role_other_tenant_names_both if {
	r := ask("tenant-member", "acme", "grant.read", "globex")
	"out-of-scope: tenant-member is scoped to tenant acme, resource is in tenant globex" in r.reasons
}

test_tenant_role_without_principal_tenant_denied if not ask("tenant-member", null, "grant.read", null).allow

test_tenant_member_cannot_approve if {
	r := ask("tenant-member", "acme", "grant.approve", "acme")
	not r.allow
	"not-permitted: role tenant-member may not grant.approve" in r.reasons
}

test_tenant_member_creates_grant if ask("tenant-member", "acme", "grant.create", "acme").allow

test_tenant_cannot_activate_policy if not ask("tenant-admin", "acme", "policy.activate", "acme").allow

test_auditor_reads_audit if ask("auditor", null, "audit.read", null).allow

test_auditor_cannot_write if not ask("auditor", null, "grant.create", "acme").allow

test_node_issues_svid if ask("node", null, "svid.issue", "acme").allow

test_node_cannot_read_audit if not ask("node", null, "audit.read", null).allow

test_unknown_role_denied if {
	r := ask("root", null, "audit.read", null)
	not r.allow
	"unknown-role: root" in r.reasons
}

test_no_principal_denied if {
	r := {"allow": api_authz.allow, "reasons": api_authz.reasons} with input as {"action": "audit.read"}
	not r.allow
	"unauthenticated: no principal id" in r.reasons
}

test_quarantine_needs_security_or_admin if {
	not ask("tenant-admin", "acme", "tenant.quarantine", "acme").allow
	ask("security", null, "tenant.quarantine", "acme").allow
	ask("security", null, "group.unquarantine", "acme").allow
	not ask("tenant-admin", "acme", "group.unquarantine", "acme").allow
	not ask("auditor", null, "group.unquarantine", "acme").allow
}

test_decision_bundles_allow_and_reasons if {
	d := api_authz.decision with input as {"principal": {"id": "p", "role": "auditor"}, "action": "audit.read", "resource": {}}
	d == {"allow": true, "reasons": ["role auditor may audit.read"]}
}

test_tenant_admin_reads_only_its_own_decisions if {
	ask("tenant-admin", "acme", "decision.read", "acme").allow
	not ask("tenant-admin", "acme", "decision.read", "globex").allow
	not ask("tenant-member", "acme", "decision.read", "acme").allow
}

# Fabric and device actions, as a table: (role, its tenant, action) -> allowed. A node's device and placement
# reads are confined to its own node by the routes; here the role alone is decided.
fabric_device_table := [
	["admin", null, "fabric.write", true],
	["admin", null, "device.read", true],
	["security", null, "fabric.read", true],
	["security", null, "device.read", true],
	["security", null, "placement.read", true],
	["security", null, "fabric.write", false],
	["security", null, "device.report", false],
	["auditor", null, "fabric.read", true],
	["auditor", null, "device.read", true],
	["auditor", null, "fabric.write", false],
	["node", null, "device.read", true],
	["node", null, "device.report", true],
	["node", null, "placement.read", true],
	["node", null, "fabric.read", false],
	["node", null, "fabric.write", false],
	["tenant-admin", "acme", "fabric.read", false],
	["tenant-admin", "acme", "fabric.write", false],
	["tenant-admin", "acme", "device.read", false],
	["tenant-member", "acme", "device.read", false],
	["workload", "acme", "device.read", false],
	["workload", "acme", "placement.read", false],
]

test_fabric_and_device_actions_table if {
	every row in fabric_device_table {
		ask(row[0], row[1], row[2], row[1]).allow == row[3]
	}
}
