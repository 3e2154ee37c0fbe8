"""The `trustfabric` command line: `trustfabric <noun> <verb>`; exit codes as CONVENTIONS.md says (cli.output's
EXIT_*): 0 ok -- done, or a question answered yes; 1 failure -- the command failed or answered no (DENY, FAILED,
failing tests, a mismatch, a denied request, BLOCKED, a domain error, the server unreachable or refusing, any
error: one readable line); 2 usage -- the command line was wrong (refused in one line before any work); 3 `audit
verify` unproven; `--json` / `--output table|wide|json|yaml` everywhere.

Where each command runs, by one rule (and `--help` shows it: every command sits in the panel for its kind,
cli.output.PANELS):
- **local** (cli/local/): the command needs what only the server host has -- the data directory's
  database and key store (init, serve, token create/revoke, svid/bundle/ca/node, policy versions, audit
  export and public-key, pdp). It runs the same services and workflows the API runs, with the operator
  (`cli:<user>`) as the actor. The data directory is TRUSTFABRIC_HOME, else the profile's `home`, else
  ./.trustfabric. `enforcer compile|plan|apply|rollback|verify|show` are local too: they compile from the
  database (seconds at scale, with progress on the terminal) and publish through the reconciler's own
  services.
- **offline**: needs nothing but files (policy validate/test, audit verify).
- **remote** (cli/remote/): everything a tenant, a security engineer, an auditor or an admin does from their
  own machine with an API token (login, tenant, group, workload, grant, token list/show, audit events, audit
  download -- the files `audit export` writes --, fabric, device, enforcer status, whoami) goes through the HTTP
  API, so the server authorizes it exactly as any other client. Server, CA and token come from flags, the
  environment or the profile `trustfabric login` keeps (cli/config.py).

Command modules import only typer and cli's own light modules at import time (the domain, the database,
the HTTP client and FastAPI load inside the command that needs them), so every command starts fast.
"""
