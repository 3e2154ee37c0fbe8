"""The `trustfabric` command line: `trustfabric <noun> <verb>`; exit 0 ok, 1 failure (one readable line),
2 usage; `--json` everywhere.

Which way a command runs, by one rule:
- **local** (cli/local/): the command needs what only the server host has -- the data directory's
  database and key store (init, serve, token create/revoke, svid/bundle/ca/node, policy, audit export
  and public-key, pdp) -- or needs nothing at all (policy validate/test, audit verify: offline). It runs
  the same services and workflows the API runs, with the operator (`cli:<user>`) as the actor. `enforcer
  compile|plan|apply|rollback|verify|show` are local too: they compile from the database (seconds at scale,
  with progress on the terminal) and publish through the reconciler's own services.
- **remote** (cli/remote/): everything a tenant, a security engineer or an admin does from their own
  machine with an API token (tenant, group, workload, grant, fabric, enforcer status, whoami) goes through the
  HTTP API, so the server authorizes it exactly as it authorizes any other client.

Command modules import only typer and cli.output at import time (the domain, the database, httpx and
FastAPI load inside the command that needs them), so `trustfabric --help` stays fast.
"""
