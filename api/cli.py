"""`trustfabric <noun> <verb>`: exit 0 ok, 1 failure (one readable line), 2 usage."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from api.cli_common import JsonOpt, emit_json, err_console, open_context
from core.errors import TrustfabricError
from core.vocabulary import DEFAULT_TRUST_DOMAIN
from workflows.context import AppContext

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


def initialize(trust_domain: str | None, key_kind: str) -> dict[str, object]:
    """Create the trust domain, audit key and admin token when missing; a second run changes nothing."""
    import audit
    from pki.keystore import KeyKind
    from pki.service import init_trust_domain
    from pki.service import trust_domain as existing_trust_domain
    from pki.tokens.service import create_opaque_token, ensure_issuer_key, has_admin_token

    with open_context(create=True) as ctx:
        audit.ensure_audit_key(ctx.keystore)
        ensure_issuer_key(ctx.keystore)
        with ctx.db.session() as session:
            # serve without --trust-domain keeps whatever init created
            trust_domain = trust_domain or existing_trust_domain(session) or ctx.settings.trust_domain
            created = init_trust_domain(
                session, ctx.keystore, trust_domain=trust_domain, key_kind=KeyKind(key_kind), clock=ctx.clock
            )
            token = None
            if not has_admin_token(session):
                token = create_opaque_token(
                    session, role="admin", subject="admin", actor=audit.Actor.system("init"),
                    description="bootstrap admin token created by init",
                )
        policy_version = seed_shipped_policy(ctx)
    return {"created": created, "trust_domain": trust_domain, "admin_token": token, "policy_version": policy_version}


def seed_shipped_policy(ctx: AppContext) -> int | None:
    """With no policy version at all, the shipped rego/ becomes version 1 and is activated, so a fresh
    install decides flows instead of denying everything for want of a policy. Skipped (None) when
    versions exist, or when activation needs a signature (the security team activates it then)."""
    from api.authz import REGO_DIR
    from audit import Actor
    from policy import service as policy_service
    from policy.versions import load_dir

    actor = Actor.system("init")
    with ctx.db.session() as session:
        if policy_service.list_versions(session):
            return None
    prepared = policy_service.prepare(load_dir(REGO_DIR))
    with ctx.db.session() as session:
        version, _created = policy_service.upload(
            session, prepared, actor, now=ctx.clock(), note="shipped policies, seeded by init"
        )
        if ctx.settings.policy_verify_keys:
            return None
        policy_service.activate(session, version.number or 0, actor, now=ctx.clock(), reason="initial policy")
        return version.number


@app.command("init")
def init_cmd(
    trust_domain: str = typer.Option(DEFAULT_TRUST_DOMAIN, "--trust-domain", help="e.g. example.org"),
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
    if result["policy_version"]:
        print(f"activated the shipped policies (rego/) as policy version {result['policy_version']}")
    if result["admin_token"]:
        print("admin API token (shown once, store it now):")
        print(result["admin_token"])


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8443, "--port"),
    trust_domain: str = typer.Option(None, "--trust-domain", help="used when init has not run yet"),
    tls: bool = typer.Option(False, "--tls", help="HTTPS with the server's own SVID; accepts client SVIDs (mTLS)"),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="uvicorn worker processes"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the API (runs init first when the trust domain does not exist yet)."""
    import ssl

    import uvicorn

    from api.auth.mtls import PeerCertH11Protocol
    from workflows.context import AppContext
    from workflows.settings import Settings

    settings = Settings.from_env()
    result = initialize(trust_domain, "ec-p256")
    if result["admin_token"]:
        print("admin API token (shown once, store it now):")
        print(result["admin_token"], flush=True)
    server_tls = None
    options: dict[str, object] = {}
    if tls:
        from api.tls import prepare_server_tls

        ctx = AppContext.open(settings)
        try:
            local = host in ("127.0.0.1", "::1", "localhost", "0.0.0.0")  # noqa: S104
            hosts = ("localhost",) if local else (host, "localhost")
            server_tls = prepare_server_tls(ctx, hosts=hosts)
        finally:
            ctx.close()
        options = {
            "ssl_certfile": str(server_tls.certfile), "ssl_keyfile": str(server_tls.keyfile),
            "ssl_keyfile_password": server_tls.password, "ssl_ca_certs": str(server_tls.ca_file),
            "ssl_cert_reqs": ssl.CERT_OPTIONAL,
        }
        print(f"serving HTTPS as {server_tls.spiffe_id}", flush=True)
    try:
        uvicorn.run(
            "api.app:app_from_env", factory=True, host=host, port=port, workers=workers, log_level=log_level,
            http=PeerCertH11Protocol, **options,  # type: ignore[arg-type]
        )
    finally:
        if server_tls is not None:
            server_tls.cleanup()


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
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # one readable line, never a traceback
        logging.getLogger("trustfabric.cli").debug("unexpected error", exc_info=True)
        err_console.print(f"error: {type(exc).__name__}: {exc}", highlight=False, markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
