"""`trustfabric init` and `trustfabric serve`: make the data directory, serve the API over it (local)."""

from __future__ import annotations

import typer

from cli.output import JsonOpt, emit_json, open_context
from core.vocabulary import DEFAULT_TRUST_DOMAIN


def register(app: typer.Typer) -> None:
    """Add init and serve to the root CLI."""
    app.command("init")(init_cmd)
    app.command("serve")(serve_cmd)


def initialize(trust_domain: str | None, key_kind: str) -> dict[str, object]:
    from workflows.init import initialize as run

    with open_context(create=True) as ctx:
        return run(ctx, trust_domain, key_kind)


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


def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8443, "--port"),
    trust_domain: str = typer.Option(None, "--trust-domain", help="used when init has not run yet"),
    tls: bool = typer.Option(False, "--tls", help="HTTPS with the server's own SVID; accepts client SVIDs (mTLS)"),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="uvicorn worker processes"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the API (runs init first when the trust domain does not exist yet)."""
    import os
    import signal
    import ssl

    from api.server import ConnectionLimits, serve, uvicorn_config
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
    limits = ConnectionLimits(
        request_read_timeout=settings.request_read_timeout_seconds,
        keep_alive_timeout=settings.keep_alive_timeout_seconds,
        max_connections=settings.max_connections, max_header_bytes=settings.max_header_bytes,
    )
    config = uvicorn_config("api.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                            log_level=log_level, limits=limits, **options)
    stopped_by = serve(config, cleanup=server_tls.cleanup if server_tls is not None else lambda: None)
    if stopped_by is not None:  # the cleanup ran: now end as the signal asked, as uvicorn does
        signal.signal(stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), stopped_by)
