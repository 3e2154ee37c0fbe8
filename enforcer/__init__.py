"""Compiles the policy's allowed flows into device rule sets: SuperNIC OpenFlow (OVS-DOCA), leaf NVUE, Linux.

Two parts. The library below is pure: no database, no HTTP, no clock; it imports only core, pki and policy
(and no module of it imports the persistence part, the database, audit or inventory: `make lint` holds that,
the `enforcer-core-stays-pure` import contract). The persistence part, the domain layout of the other
packages, builds on it:
  enforcer.models / migrations        versioned rule sets per device (version, content hash, canonical IR,
                                       cause, time) and each device's state and agent report
  enforcer.service                     publish / hold / rollback / record_status, each with its audit event
  enforcer.fabric_db                   the fabric inventory's tables read as a fabric document and a Fabric
  enforcer.reconcile.Reconciler        desired rule sets from the database, published where they changed
                                       (triggers, incremental recompile, manual mode, pins)

The pieces of the pure library, in the order a caller uses them (the persistence layer, the API/CLI, the lab
and the node agents build on these):

Input
  enforcer.fabric.Fabric               frozen model: tenants (VNI, VLAN = conntrack zone, prefixes), groups,
                                       workloads, GPU nodes + SuperNIC ports, leaves/spines, links, placements,
                                       grants. `policy_data(fabric)` is the rego data document for a
                                       self-contained fabric; `revoked_ids(fabric)` its revoked SPIFFE IDs.
  enforcer.fabric_file.load_fabric(text, source=..., known_workloads=..., pools=..., stored=...) -> Fabric
                                       strict YAML parser (`trustfabric fabric import`, `lab up`); FabricError
                                       (an InvalidInput, so a 400) says file:line: field: what is wrong;
                                       `stored` merges the file onto the database's fabric, load_fabric_value
                                       checks a document built in code (the API's single changes).
  enforcer.allocate.Pools / allocate   VNI, VLAN and prefix pools for tenants that lack them.
  enforcer/examples/small.yaml         the golden fabric (two tenants, platform service, one grant).

Compile
  enforcer.compiler.compile_fabric(fabric, allowed_flows, revoked_ids, Budget) -> Compiled
      `allowed_flows` is the compact `data.flows.allowed_flows` answer (policy.decide.ALLOWED_FLOWS_QUERY).
      Compiled.devices: {"nic:<node>" | "leaf:<name>": DeviceRuleSet}; BudgetExceeded names overflowing
      devices and their largest contributors (reasons).
  enforcer.compiler.recompile(previous, allowed_flows, revoked_ids) -> Compiled
      redoes only the changed entries; `.recompiled` / `.changed` name the devices touched / changed.
  enforcer.fairshare.fit_device(compiled, device, published) -> Fit
      a device over budget with allow entries withheld, from the tenants furthest over their fair share, until
      it fits (`.rules`; None: it cannot); `.withheld` per tenant, `.note()` / `.summary()` name them.
  enforcer.ir.DeviceRuleSet            one device: address sets, ordered FlowRules (reasons = policy rule or
                                       grant:<id>), VRFs with leaked routes, ports; `.canonical` bytes (RFC 8785)
                                       and `.content_hash` for versioning; `.to_dict()` / `from_dict()`.

Check and plan
  enforcer.equivalence.verify(compiled, allowed_flows, exhaustive=False) -> [Mismatch]   (empty: equivalent)
  enforcer.plan.plan(old_devices, new_devices, budget) -> [DevicePlan]  (added/removed rules and leaks,
                                       budget use; `.summary()` for audit events and staged-mode reports)

Render (pure)
  enforcer.render.openflow.render_openflow(rs, port_names) / render_flows / cookie_map
  enforcer.render.nvue.nvue_yaml(rs) / nv_set_commands(rs) / render_nvue(rs) / validate_nvue(doc)
  enforcer.render.linux.render_linux(rs, fabric, port_names=, fabric_ports=) -> LinuxLeafConfig(nft, ip_rules,
                                       routes, set_names)

Apply (enforcer.backends.base.Backend: render / apply / installed / drift; one conformance test for all;
       Counting: counters(rules) -> [RuleCounter] per rule with its reasons, for OVS and Linux)
  enforcer.backends.ovs.OvsBackend(daemons, bridge, port_names)   ovs-ofctl --bundle replace-flows
  enforcer.backends.nvue.NvueBackend(base_url, auth)              NVUE REST: revision -> patch -> apply
  enforcer.backends.linux.LinuxBackend(netns, fabric, LeafWiring)  the lab's leaf: nftables in one transaction
                                       inside the namespace, VRF tables + ip rules converged around it
  enforcer.ovsd.OvsDaemons(rundir, netns=)  private ovsdb-server + ovs-vswitchd (OVS_RUNDIR etc.), bridges with
                                       datapath_type=netdev; the lab hosts one bridge per node on one daemon.
  enforcer.netns.run_in(name, fn)      fn on a thread inside a network namespace (never the root one's rules)
"""
