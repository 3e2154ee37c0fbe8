# Which flows between workload groups are allowed, and why.
#
# Decides on identities (tenant, group, SPIFFE ID), never on addresses.
# Data (built by policy/data.py), all under data.tf:
#   tenants[t] = {"quarantined": bool, "groups": {g: {"labels", "exposed": {proto: [sorted ports]},
#                 "sensitivity", "quarantined"}}}   (exposed: the group's service ports, by protocol)
#   grants[src_tenant][dst_tenant][id] = {"src_group", "dst_group", "proto", "ports": [int], "expires_at_ns"}
#   revoked[spiffe_id] = true
#   tenants[t].revoked / tenants[t].groups[g].revoked = true: every identity of the tenant / group revoked
#   (through pki): withdrawn from every flow, like a quarantine (absent: not revoked)
#   now_ns = optional: a pinned "now" (tests, replays); input.now_ns overrides it; neither: the engine's clock
# Default deny. Quarantine and revoked identities override every allow.
package flows

platform_tenant := "platform"

# data.tf.* read by path with a default (absent: empty), not object.get(data, ...): regorus's compiled VM
# (policy/engines/rvm.py) refuses any read of the data root itself.
default tenants := {}

tenants := data.tf.tenants

default grants := {}

grants := data.tf.grants

default revoked := {}

revoked := data.tf.revoked

# Every identity of the tenant or of the group is revoked.
group_revoked(t, _) if tenants[t].revoked == true

group_revoked(t, g) if tenants[t].groups[g].revoked == true

now_ns := input.now_ns if {
	is_number(input.now_ns)
} else := data.tf.now_ns if {
	is_number(data.tf.now_ns)
} else := time.now_ns()

# ---------------------------------------------------------------- whole set, for the compiler
# One element per (destination group, proto, reason): the sorted ports and every source group
# ("tenant/group", never the destination group itself) allowed to reach them. Compact on purpose:
# 1,000 tenants x 10 groups give ~15k elements, not ~200k; policy.decide.expand_allowed() turns it into
# (src, dst, proto, port) flows. Built with array comprehensions (no duplicates by construction):
# measured ~3x faster in regorus than a partial set of objects at that scale.
#
# Written for regorus's costs (issue 11: the whole set at 1,000 tenants): every statement of a comprehension
# body costs a few thousand instructions per iteration, each variable in scope adds to that, a builtin call
# costs more (~10k), and a rule referenced inside a loop, or a double index into one, is far dearer still. So:
# the liveness checks and the "tenant/group" strings are computed once (live_sources) and shared by the three
# parts; a rule's value is bound to a local once, outside the loops; a destination's sources are one set
# difference (sorted: the order of the group names, as before) instead of a filter over every group; the
# element is the comprehension's head (no variable for it).

allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)

# {tenant: {group: "tenant/group"}}: every tenant and group neither quarantined nor revoked (a withdrawn
# tenant is absent; a live tenant with no live group maps to {}). The only place those checks are made for
# the whole set.
live_sources := {t: {g: concat("/", [t, g]) | some g, grp in tenant.groups; not grp.quarantined; not grp.revoked} |
	some t, tenant in tenants
	not tenant.quarantined
	not tenant.revoked
}

# A live group's exposed ports, to every other live group of its tenant.
intra_tenant_flows := [{
	"dst_tenant": t, "dst_group": dg, "proto": proto, "ports": ports,
	"reason": "intra-tenant", "sources": sort(srcset - {own}),
} |
	some t, srcmap in live_sources
	count(srcmap) > 1 # else no other group is left to be a source
	srcset := {s | some s in srcmap}
	groups := tenants[t].groups
	some dg, own in srcmap
	some proto, ports in groups[dg].exposed
	ports != []
]

# Every live group of every tenant but the platform's.
every_tenant_source := [s |
	some t, srcmap in live_sources
	t != platform_tenant
	some s in srcmap
]

# A live platform group's exposed ports, to every tenant's live groups.
platform_flows := [{
	"dst_tenant": platform_tenant, "dst_group": dg, "proto": proto, "ports": ports,
	"reason": "platform-service", "sources": sources,
} |
	srcmap := live_sources[platform_tenant]
	sources := every_tenant_source
	sources != []
	groups := tenants[platform_tenant].groups
	some dg, _ in srcmap
	some proto, ports in groups[dg].exposed
	ports != []
]

# An unexpired grant between two tenants, both groups live.
granted_flows := [{
	"dst_tenant": dt, "dst_group": g.dst_group, "proto": g.proto, "ports": sort(g.ports),
	"reason": concat("", ["grant:", id]), "sources": [source],
} |
	live := live_sources
	now := now_ns
	some st, by_dst in grants
	srcs := live[st]
	some dt, by_id in by_dst
	st != dt
	dsts := live[dt]
	some id, g in by_id
	g.expires_at_ns > now
	source := srcs[g.src_group]
	dsts[g.dst_group]
]

# Workload identities the compiler must drop from every flow above.
revoked_identities := {id | some id, v in revoked; v == true}

# ---------------------------------------------------------------- one flow, with reasons
# input: {"src": {"tenant", "group", "spiffe_id"?}, "dst": {...}, "proto": "tcp"|"udp", "port": int, "now_ns"?}

src := input.src

dst := input.dst

label(side) := sprintf("%s/%s", [side.tenant, side.group])

well_formed if {
	is_string(src.tenant)
	is_string(src.group)
	is_string(dst.tenant)
	is_string(dst.group)
	input.proto in {"tcp", "udp"}
	is_number(input.port)
}

known(side) if tenants[side.tenant].groups[side.group]

exposed if input.port in tenants[dst.tenant].groups[dst.group].exposed[input.proto]

spiffe_mismatch(side) if {
	is_string(side.spiffe_id)
	not contains(side.spiffe_id, sprintf("/tenant/%s/group/%s/", [side.tenant, side.group]))
}

# Overrides: any of these denies whatever else allows.
override contains "malformed: input needs src/dst tenant and group, proto tcp|udp and a numeric port" if not well_formed

override contains sprintf("unknown-identity: %s/%s is not in the inventory", [side.tenant, side.group]) if {
	well_formed
	some side in [src, dst]
	not known(side)
}

override contains sprintf("identity-mismatch: %s is not in %s", [side.spiffe_id, label(side)]) if {
	well_formed
	some side in [src, dst]
	spiffe_mismatch(side)
}

override contains sprintf("revoked-identity: %s is revoked", [side.spiffe_id]) if {
	some side in [src, dst]
	revoked[side.spiffe_id] == true
}

override contains sprintf("revoked-identity: every identity of %s is revoked", [label(side)]) if {
	well_formed
	some side in [src, dst]
	group_revoked(side.tenant, side.group)
}

override contains sprintf("quarantined: tenant %s is quarantined", [t]) if {
	well_formed
	some t in {src.tenant, dst.tenant}
	tenants[t].quarantined == true
}

override contains sprintf("quarantined: group %s is quarantined", [label(side)]) if {
	well_formed
	some side in [src, dst]
	tenants[side.tenant].groups[side.group].quarantined == true
}

allow_reasons contains sprintf("intra-tenant: %s exposes %s/%d to its own tenant", [label(dst), input.proto, input.port]) if {
	src.tenant == dst.tenant
	src.group != dst.group
	exposed
}

allow_reasons contains sprintf("platform-service: %s exposes %s/%d to every tenant", [label(dst), input.proto, input.port]) if {
	dst.tenant == platform_tenant
	src.tenant != platform_tenant
	exposed
}

allow_reasons contains sprintf("grant:%s allows %s -> %s on %s/%d", [id, label(src), label(dst), input.proto, input.port]) if {
	src.tenant != dst.tenant
	some id, g in grants[src.tenant][dst.tenant]
	g.src_group == src.group
	g.dst_group == dst.group
	g.proto == input.proto
	input.port in g.ports
	g.expires_at_ns > now_ns
}

# Why nothing allowed it (only reported when no override and no allow applies).
no_match contains sprintf("port-not-exposed: %s does not expose %s/%d", [label(dst), input.proto, input.port]) if {
	well_formed
	known(dst)
	not exposed
	count(allow_reasons) == 0
}

no_match contains sprintf("no-grant: no active grant from %s to %s on %s/%d", [label(src), label(dst), input.proto, input.port]) if {
	well_formed
	src.tenant != dst.tenant
	dst.tenant != platform_tenant
	count(allow_reasons) == 0
}

no_match contains sprintf("same-group: %s to itself is not a group flow", [label(src)]) if {
	well_formed
	src.tenant == dst.tenant
	src.group == dst.group
}

default decision := {"allow": false, "reasons": ["default-deny: no rule allows this flow"]}

decision := {"allow": false, "reasons": sort(override)} if count(override) > 0

decision := {"allow": true, "reasons": sort(allow_reasons)} if {
	count(override) == 0
	count(allow_reasons) > 0
}

decision := {"allow": false, "reasons": sort(no_match)} if {
	count(override) == 0
	count(allow_reasons) == 0
	count(no_match) > 0
}
