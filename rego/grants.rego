# The decision on a tenant's grant request: approve (auto), pending with the approvers needed, or deny.
#
# input: {"requester": {"tenant"}, "src": {"tenant", "group"}, "dst": {"tenant", "group"},
#         "proto": "tcp"|"udp", "ports": [int], "ttl_seconds": int}
# data.tf: see flows.rego (read by path with a default, never through the data root: see there).
# Approvers: "tenant-admin:<dst tenant>" always; plus "security" for sensitive destination groups.
# Auto-approve: only when the destination group carries the label grants.trustfabric.io/auto-approve=true
# and is not sensitive.
package grants

max_ttl_seconds := 604800 # 7 days

default tenants := {}

tenants := data.tf.tenants

dst_group := tenants[input.dst.tenant].groups[input.dst.group]

sensitive if dst_group.sensitivity == "sensitive"

sensitive if dst_group.labels.sensitive == "true"

label(side) := sprintf("%s/%s", [side.tenant, side.group])

wildcard(p) if not is_number(p)

wildcard(p) if {
	is_number(p)
	not valid_port(p)
}

valid_port(p) if {
	p == floor(p)
	p >= 1
	p <= 65535
}

deny contains "malformed: request needs requester.tenant, src and dst tenant and group" if {
	not is_string(input.requester.tenant)
}

deny contains "malformed: request needs requester.tenant, src and dst tenant and group" if {
	some side in ["src", "dst"]
	some field in ["tenant", "group"]
	not is_string(input[side][field])
}

deny contains sprintf("out-of-scope: %s may only request grants for its own tenant, not %s", [input.requester.tenant, input.src.tenant]) if {
	is_string(input.requester.tenant)
	input.requester.tenant != input.src.tenant
}

deny contains "same-tenant: flows inside a tenant need no grant" if input.src.tenant == input.dst.tenant

deny contains sprintf("unknown-group: %s is not in the inventory", [label(side)]) if {
	some side in [input.src, input.dst]
	not tenants[side.tenant].groups[side.group]
}

deny contains sprintf("bad-proto: %v is not tcp or udp", [input.proto]) if not input.proto in {"tcp", "udp"}

deny contains "wildcard-ports: ports must be a non-empty list of explicit port numbers" if not is_array(input.ports)

# count() only of an array: the interpreter fails on count(5) where the compiled VM answers undefined, and a
# non-array is refused by the rule above anyway
deny contains "wildcard-ports: ports must be a non-empty list of explicit port numbers" if {
	is_array(input.ports)
	count(input.ports) == 0
}

deny contains sprintf("wildcard-ports: %v is not an explicit port number (1-65535)", [p]) if {
	is_array(input.ports)
	some p in input.ports
	wildcard(p)
}

deny contains sprintf("port-not-exposed: %s does not expose %s/%v", [label(input.dst), input.proto, p]) if {
	dst_group
	is_array(input.ports)
	some p in input.ports
	not wildcard(p)
	not p in object.get(dst_group.exposed, input.proto, [])
}

deny contains sprintf("ttl-too-long: %v s is above the maximum of %d s (7 days)", [input.ttl_seconds, max_ttl_seconds]) if {
	is_number(input.ttl_seconds)
	input.ttl_seconds > max_ttl_seconds
}

deny contains "bad-ttl: ttl_seconds must be a positive number" if not is_number(input.ttl_seconds)

deny contains "bad-ttl: ttl_seconds must be a positive number" if input.ttl_seconds <= 0

deny contains sprintf("quarantined: %s tenant %s is quarantined", [role, t]) if {
	some role, t in {"requester": input.requester.tenant, "source": input.src.tenant, "destination": input.dst.tenant}
	tenants[t].quarantined == true
}

deny contains sprintf("revoked-identity: every identity of %s is revoked", [label(side)]) if {
	some side in [input.src, input.dst]
	group_revoked(side.tenant, side.group)
}

group_revoked(t, _) if tenants[t].revoked == true

group_revoked(t, g) if tenants[t].groups[g].revoked == true

deny contains sprintf("quarantined: group %s is quarantined", [label(side)]) if {
	some side in [input.src, input.dst]
	tenants[side.tenant].groups[side.group].quarantined == true
}

approvers contains sprintf("tenant-admin:%s", [input.dst.tenant])

approvers contains "security" if sensitive

auto_approve if {
	dst_group.labels["grants.trustfabric.io/auto-approve"] == "true"
	not sensitive
}

default decision := {"outcome": "deny", "approvers": [], "reasons": ["default-deny: no grant rule matched"]}

decision := {"outcome": "deny", "approvers": [], "reasons": sort(deny)} if count(deny) > 0

decision := {"outcome": "approve", "approvers": [], "reasons": [sprintf("auto-approve: %s is labelled for automatic approval", [label(input.dst)])]} if {
	count(deny) == 0
	auto_approve
}

decision := {"outcome": "pending", "approvers": sort(approvers), "reasons": reasons} if {
	count(deny) == 0
	not auto_approve
	reasons := [sprintf("approval-needed: %s", [a]) | some a in sort(approvers)]
}
