package grants_test

import data.grants

grp(ports, sensitivity, labels, quarantined) := {
	"labels": labels, "ports": [{"proto": "tcp", "port": p} | some p in ports],
	"exposed": {"tcp": sort(ports)}, "sensitivity": sensitivity, "quarantined": quarantined,
}

inventory := {"tenants": {
	"acme": {"quarantined": false, "groups": {"web": grp([443], "normal", {}, false)}},
	"globex": {"quarantined": false, "groups": {
		"api": grp([8443, 9000], "normal", {}, false),
		"vault": grp([8200], "sensitive", {}, false),
		"tagged": grp([8300], "normal", {"sensitive": "true"}, false),
		"open": grp([80], "normal", {"grants.trustfabric.io/auto-approve": "true"}, false),
		"cell": grp([22], "normal", {}, true),
	}},
	"evil": {"quarantined": true, "groups": {"bot": grp([80], "normal", {}, false)}},
}}

req(dg, ports, ttl) := {
	"requester": {"tenant": "acme"}, "src": {"tenant": "acme", "group": "web"},
	"dst": {"tenant": "globex", "group": dg}, "proto": "tcp", "ports": ports, "ttl_seconds": ttl,
}

decide(i) := d if d := grants.decision with data.tf as inventory with input as i

has_reason_prefix(d, prefix) if {
	some r in d.reasons
	startswith(r, prefix)
}

test_normal_group_pending_dst_admin if {
	d := decide(req("api", [8443], 3600))
	d.outcome == "pending"
	d.approvers == ["tenant-admin:globex"]
}

test_sensitive_group_needs_security if {
	d := decide(req("vault", [8200], 3600))
	d.outcome == "pending"
	d.approvers == ["security", "tenant-admin:globex"]
}

test_sensitive_label_needs_security if {
	d := decide(req("tagged", [8300], 3600))
	d.approvers == ["security", "tenant-admin:globex"]
}

test_auto_approve_label if {
	d := decide(req("open", [80], 3600))
	d.outcome == "approve"
	d.approvers == []
}

test_port_not_exposed_denied if {
	d := decide(req("api", [22], 3600))
	d.outcome == "deny"
	d.reasons == ["port-not-exposed: globex/api does not expose tcp/22"]
}

test_ttl_over_seven_days_denied if {
	d := decide(req("api", [8443], 604801))
	d.outcome == "deny"
	has_reason_prefix(d, "ttl-too-long:")
}

test_ttl_exactly_seven_days_ok if {
	d := decide(req("api", [8443], 604800))
	d.outcome == "pending"
}

test_zero_ttl_denied if {
	d := decide(req("api", [8443], 0))
	has_reason_prefix(d, "bad-ttl:")
}

test_wildcard_string_denied if {
	d := decide(req("api", "*", 3600))
	d.outcome == "deny"
	has_reason_prefix(d, "wildcard-ports:")
}

test_wildcard_in_list_denied if {
	d := decide(req("api", [8443, "*"], 3600))
	d.outcome == "deny"
	has_reason_prefix(d, "wildcard-ports:")
}

test_port_zero_denied if {
	d := decide(req("api", [0], 3600))
	has_reason_prefix(d, "wildcard-ports:")
}

# a number is no list: denied with the reason, never an evaluation error (count() of a number fails)
test_number_ports_denied if {
	d := decide(req("api", 8443, 3600))
	d.outcome == "deny"
	has_reason_prefix(d, "wildcard-ports:")
}

test_empty_ports_denied if {
	d := decide(req("api", [], 3600))
	has_reason_prefix(d, "wildcard-ports:")
}

test_quarantined_destination_group_denied if {
	d := decide(req("cell", [22], 3600))
	d.outcome == "deny"
	has_reason_prefix(d, "quarantined: group globex/cell")
}

test_quarantined_requester_denied if {
	i := {
		"requester": {"tenant": "evil"}, "src": {"tenant": "evil", "group": "bot"},
		"dst": {"tenant": "globex", "group": "api"}, "proto": "tcp", "ports": [8443], "ttl_seconds": 60,
	}
	d := decide(i)
	d.outcome == "deny"
	has_reason_prefix(d, "quarantined: requester tenant evil")
}

test_quarantined_destination_tenant_denied if {
	i := object.union(req("api", [80], 60), {"dst": {"tenant": "evil", "group": "bot"}})
	d := decide(i)
	d.outcome == "deny"
	has_reason_prefix(d, "quarantined: destination tenant evil")
}

test_requester_outside_source_tenant_denied if {
	i := object.union(req("api", [8443], 60), {"requester": {"tenant": "globex"}})
	d := decide(i)
	has_reason_prefix(d, "out-of-scope:")
}

test_unknown_group_denied if {
	d := decide(req("nope", [1], 60))
	has_reason_prefix(d, "unknown-group:")
}

test_same_tenant_denied if {
	i := object.union(req("api", [443], 60), {"dst": {"tenant": "acme", "group": "web"}})
	d := decide(i)
	has_reason_prefix(d, "same-tenant:")
}

test_many_reasons_reported_together if {
	d := decide(req("api", [22], 999999999))
	count(d.reasons) == 2
}

test_revoked_identities_denied if {
	d := grants.decision with data.tf as object.union(inventory, {"tenants": {"globex": {"groups": {"api": {"revoked": true}}}}})
		with input as req("api", [8443], 3600)
	d.outcome == "deny"
	has_reason_prefix(d, "revoked-identity: every identity of globex/api is revoked")
	e := grants.decision with data.tf as object.union(inventory, {"tenants": {"acme": {"revoked": true}}})
		with input as req("api", [8443], 3600)
	e.outcome == "deny"
	has_reason_prefix(e, "revoked-identity: every identity of acme/web is revoked")
}
