"""The node agent (`trustfabric agent --node NAME`): runs on a GPU node (or, in the lab and on a Cumulus
switch, on a leaf) without the server's database and talks to the API over HTTPS only.

  agent.identity      join-token attestation once, the node key (0600) and SVID in the data directory,
                      renewal at half life, the trust bundle (refreshed: CA rotation-aware)
  agent.api           the mTLS client of the device, placement and SVID endpoints
  agent.wiring        which backend realises each device id (the lab's state file in agent mode)
  agent.device_loop   per device: long-poll, render + apply, drift repair, reports (no server request under
                      the device lock), fail static
  agent.workload_api  the SPIFFE Workload API (gRPC on a unix socket) with peer-credential attestation
  agent.peercred      the caller's uid/gid/pid (SO_PEERCRED) and the selectors it matches
  agent.svids         workload SVIDs: keys made here, certificates from the server, rotation
  agent.metrics       Prometheus metrics
  agent.runner        composes them (what the CLI command runs)

A layer beside api, pdp and lab: it imports the pure enforcer library (renderers, backends), pki's pure
helpers (SPIFFE IDs, selectors) and core; never the database, audit, workflows or the server's services
(`make lint`: the agent-talks-https-only import contract).
"""
