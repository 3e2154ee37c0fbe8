"""`trustfabric <noun> <verb>`: exit 0 ok, 1 failure (one readable line), 2 usage."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from api.cli_common import JsonOpt, emit_json, err_console, open_context
from core.errors import TrustfabricError

app = typer.Typer(
    name="trustfabric",
    help="Zero-trust identity, policy and audit for a multi-tenant AI cloud.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

SUBCOMMANDS = (
    "api.cli_pki",
    "api.cli_audit",
    "api.cli_policy",
    "api.cli_inventory",
    "api.cli_grants",
    "api.cli_tokens",
)


def initialize(trust_domain: str, key_kind: str) -> dict[str, object]:
    """Create the trust domain, audit key and admin token when missing; a second run changes nothing."""
    import audit
    from api.tokens import create_opaque_token, has_admin_token
    from pki.keystore import KeyKind
    from pki.service import init_trust_domain

    with open_context(create=True) as ctx:
        ensure_audit_key = getattr(audit, "ensure_audit_key", None)
        if ensure_audit_key is not None:
            ensure_audit_key(ctx.keystore)
        with ctx.db.session() as session:
            created = init_trust_domain(
                session, ctx.keystore, trust_domain=trust_domain, key_kind=KeyKind(key_kind), clock=ctx.clock
            )
            token = None
            if not has_admin_token(session):
                token = create_opaque_token(
                    session, role="admin", subject="admin", actor=audit.Actor.system("init"),
                    description="bootstrap admin token created by init",
                )
    return {"created": created, "trust_domain": trust_domain, "admin_token": token}


@app.command("init")
def init_cmd(
    trust_domain: str = typer.Option("trustfabric.local", "--trust-domain", help="e.g. example.org"),
    key_kind: str = typer.Option("ec-p256", "--key-kind", help="ec-p256 (default) or ec-p384"),
    json_out: bool = JsonOpt,
) -> None:
    """Create the trust domain's root and issuing CAs, the audit key and an admin API token."""
    result = initialize(trust_domain, key_kind)
    if json_out:
        emit_json(result)
        return
    if result["created"]:
        print(f"initialised trust domain spiffe://{trust_domain}")
    else:
        print("trust domain already initialised; nothing changed")
    if result["admin_token"]:
        print("admin API token (shown once, store it now):")
        print(result["admin_token"])


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8443, "--port"),
    trust_domain: str = typer.Option(None, "--trust-domain", help="used when init has not run yet"),
) -> None:
    """Serve the API (runs init first when the trust domain does not exist yet)."""
    import uvicorn

    from api.app import create_app
    from api.config import Settings
    from api.context import AppContext

    settings = Settings.from_env()
    result = initialize(trust_domain or settings.trust_domain, "ec-p256")
    if result["admin_token"]:
        print("admin API token (shown once, store it now):")
        print(result["admin_token"], flush=True)
    ctx = AppContext.open(settings)
    try:
        uvicorn.run(create_app(ctx), host=host, port=port, log_level="info")
    finally:
        ctx.close()


for _name in SUBCOMMANDS:
    try:
        importlib.import_module(_name).register(app)
    except ModuleNotFoundError as _exc:
        if _exc.name != _name:
            raise


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app(standalone_mode=True)
    except TrustfabricError as exc:
        err_console.print(f"error: {exc}", highlight=False, markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
