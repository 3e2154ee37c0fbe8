package flows_test

import data.flows

far := 9999999999000000000

inventory := {
	"now_ns": 1000,
	"tenants": {
		"acme": {"quarantined": false, "groups": {
			"web": {"labels": {}, "ports": [{"proto": "tcp", "port": 443}], "exposed": {"tcp": [443]}, "sensitivity": "normal", "quarantined": false},
			"db": {"labels": {}, "ports": [{"proto": "tcp", "port": 5432}], "exposed": {"tcp": [5432]}, "sensitivity": "sensitive", "quarantined": false},
			"jail": {"labels": {}, "ports": [{"proto": "tcp", "port": 22}], "exposed": {"tcp": [22]}, "sensitivity": "normal", "quarantined": true},
		}},
		"globex": {"quarantined": false, "groups": {
			"api": {"labels": {}, "ports": [{"proto": "tcp", "port": 8443}], "exposed": {"tcp": [8443]}, "sensitivity": "normal", "quarantined": false},
		}},
		"evil": {"quarantined": true, "groups": {
			"bot": {"labels": {}, "ports": [{"proto": "tcp", "port": 80}], "exposed": {"tcp": [80]}, "sensitivity": "normal", "quarantined": false},
		}},
		"platform": {"quarantined": false, "groups": {
			"dns": {"labels": {}, "ports": [{"proto": "udp", "port": 53}], "exposed": {"udp": [53]}, "sensitivity": "normal", "quarantined": false},
		}},
	},
	"grants": {
		"acme": {"globex": {
			"g-live": {"src_group": "web", "dst_group": "api", "proto": "tcp", "ports": [8443], "expires_at_ns": far},
			"g-old": {"src_group": "db", "dst_group": "api", "proto": "tcp", "ports": [8443], "expires_at_ns": 500},
		}},
		"evil": {"acme": {"g-evil": {"src_group": "bot", "dst_group": "web", "proto": "tcp", "ports": [443], "expires_at_ns": far}}},
	},
	"revoked": {"spiffe://td/tenant/acme/group/web/w-bad": true},
}

flow(st, sg, dt, dg, proto, port) := {"src": {"tenant": st, "group": sg}, "dst": {"tenant": dt, "group": dg}, "proto": proto, "port": port}

decide(i) := d if d := flows.decision with data.tf as inventory with input as i

has_reason_prefix(d, prefix) if {
	some r in d.reasons
	startswith(r, prefix)
}

test_intra_tenant_exposed_port_allowed if {
	d := decide(flow("acme", "web", "acme", "db", "tcp", 5432))
	d.allow
	has_reason_prefix(d, "intra-tenant:")
}

test_intra_tenant_unexposed_port_denied if {
	d := decide(flow("acme", "web", "acme", "db", "tcp", 22))
	not d.allow
	has_reason_prefix(d, "port-not-exposed:")
}

test_cross_tenant_without_grant_denied if {
	d := decide(flow("globex", "api", "acme", "web", "tcp", 443))
	not d.allow
	has_reason_prefix(d, "no-grant:")
}

test_cross_tenant_with_grant_allowed if {
	d := decide(flow("acme", "web", "globex", "api", "tcp", 8443))
	d.allow
	d.reasons == ["grant:g-live allows acme/web -> globex/api on tcp/8443"]
}

test_expired_grant_denied if {
	d := decide(flow("acme", "db", "globex", "api", "tcp", 8443))
	not d.allow
	has_reason_prefix(d, "no-grant:")
}

test_grant_expires_with_input_now if {
	i := object.union(flow("acme", "web", "globex", "api", "tcp", 8443), {"now_ns": far})
	d := decide(i)
	not d.allow
}

test_platform_reachable_by_all if {
	d := decide(flow("globex", "api", "platform", "dns", "udp", 53))
	d.allow
	has_reason_prefix(d, "platform-service:")
}

test_platform_wrong_proto_denied if {
	d := decide(flow("globex", "api", "platform", "dns", "tcp", 53))
	not d.allow
}

test_quarantined_tenant_overrides_grant if {
	d := decide(flow("evil", "bot", "acme", "web", "tcp", 443))
	not d.allow
	d.reasons == ["quarantined: tenant evil is quarantined"]
}

test_quarantined_tenant_cannot_reach_platform if {
	d := decide(flow("evil", "bot", "platform", "dns", "udp", 53))
	not d.allow
}

test_quarantined_group_denied if {
	d := decide(flow("acme", "web", "acme", "jail", "tcp", 22))
	not d.allow
	has_reason_prefix(d, "quarantined: group acme/jail")
}

test_revoked_identity_overrides_everything if {
	i := object.union(flow("acme", "web", "acme", "db", "tcp", 5432), {"src": {"tenant": "acme", "group": "web", "spiffe_id": "spiffe://td/tenant/acme/group/web/w-bad"}})
	d := decide(i)
	not d.allow
	has_reason_prefix(d, "revoked-identity:")
}

test_spiffe_id_outside_claimed_group_denied if {
	i := object.union(flow("acme", "web", "acme", "db", "tcp", 5432), {"src": {"tenant": "acme", "group": "web", "spiffe_id": "spiffe://td/tenant/globex/group/api/w1"}})
	d := decide(i)
	not d.allow
	has_reason_prefix(d, "identity-mismatch:")
}

test_unknown_identity_denied if {
	d := decide(flow("nobody", "x", "acme", "web", "tcp", 443))
	not d.allow
	has_reason_prefix(d, "unknown-identity:")
}

test_malformed_input_denied if {
	d := flows.decision with data.tf as inventory with input as {"src": "acme"}
	not d.allow
	has_reason_prefix(d, "malformed:")
}

test_no_data_denies if {
	d := flows.decision with data.tf as {} with input as flow("acme", "web", "acme", "db", "tcp", 5432)
	not d.allow
}

test_allowed_flows_set if {
	fs := flows.allowed_flows with data.tf as inventory
	{"dst_tenant": "acme", "dst_group": "db", "proto": "tcp", "ports": [5432], "reason": "intra-tenant", "sources": ["acme/web"]} in fs
	{"dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443], "reason": "grant:g-live", "sources": ["acme/web"]} in fs
	count([f | some f in fs; f.dst_tenant == "platform"]) == 1
	count([f | some f in fs; f.reason == "grant:g-old"]) == 0
	count([f | some f in fs; f.reason == "grant:g-evil"]) == 0
	count([f | some f in fs; f.dst_group == "jail"]) == 0
}

test_platform_sources_exclude_quarantined if {
	fs := flows.allowed_flows with data.tf as inventory
	some f in fs
	f.dst_tenant == "platform"
	f.sources == ["acme/db", "acme/web", "globex/api"]
}

test_revoked_identities_listed if {
	ids := flows.revoked_identities with data.tf as inventory
	ids == {"spiffe://td/tenant/acme/group/web/w-bad"}
}

# Identities revoked wholesale (a tenant or a group, through pki) withdraw the group from every flow.
revoked_inventory := object.union(inventory, {"tenants": {"acme": {"groups": {"web": {"revoked": true}}}, "globex": {"revoked": true}}})

test_revoked_group_denied_both_ways if {
	d := flows.decision with data.tf as revoked_inventory with input as flow("acme", "web", "acme", "db", "tcp", 5432)
	not d.allow
	has_reason_prefix(d, "revoked-identity: every identity of acme/web is revoked")
	e := flows.decision with data.tf as revoked_inventory with input as flow("acme", "db", "acme", "web", "tcp", 443)
	not e.allow
}

test_revoked_tenant_overrides_its_grants if {
	d := flows.decision with data.tf as revoked_inventory with input as flow("acme", "db", "globex", "api", "tcp", 8443)
	not d.allow
	has_reason_prefix(d, "revoked-identity: every identity of globex/api is revoked")
}

test_revoked_groups_leave_allowed_flows if {
	fs := flows.allowed_flows with data.tf as revoked_inventory
	count([f | some f in fs; f.reason == "grant:g-live"]) == 0
	count([f | some f in fs; f.dst_group == "web"]) == 0
	count([f | some f in fs; f.dst_tenant == "globex"]) == 0
	count([f | some f in fs; "acme/web" in f.sources]) == 0
	count([f | some f in fs; "globex/api" in f.sources]) == 0
	some p in fs
	p.dst_tenant == "platform"
	p.sources == ["acme/db"]
}
