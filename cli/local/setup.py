"""`trustfabric init` and `trustfabric serve`: make the data directory, serve the API over it (local)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from cli.output import LOCAL, check_listen_address, command, emit, fail, local_settings, machine_output, open_context
from cli.params import PORT, TRUST_DOMAIN, choice
from core.errors import InvalidInput


def register(app: typer.Typer) -> None:
    """Add init and serve to the root CLI."""
    command(app, "init", LOCAL)(init_cmd)
    command(app, "serve", LOCAL, output=False)(serve_cmd)


TOKEN_FILE = "bootstrap-admin-token"


def deliver_admin_token(token: str, expires_at: object, home: Path, *, json_out: bool = False) -> dict[str, object]:
    """Show the bootstrap admin token to the person at the terminal, and only there: when stdout is not a
    terminal (a service manager's log, a pipe) it goes to a file of mode 0600 in the data directory instead
    and stdout says where. Returns what --json prints about it."""
    from cli.humanize import when

    if sys.stdout.isatty():
        if not json_out:
            print(f"admin API token (shown once, store it now; expires {when(expires_at)}):")
            print(token, flush=True)
        return {"admin_token": token, "admin_token_expires_at": expires_at}
    path = home / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    if not json_out:
        print(f"admin API token written to {path} (mode 0600; stdout is not a terminal; expires "
              f"{when(expires_at)})", flush=True)
    return {"admin_token": None, "admin_token_file": str(path), "admin_token_expires_at": expires_at}


def initialize(trust_domain: str | None, key_kind: str) -> dict[str, object]:
    """workflows.init with --trust-domain (None: an existing data directory's, else TRUSTFABRIC_TRUST_DOMAIN's,
    else trustfabric.local). The variable is checked first, before the data directory or a key is made: a value
    that names no trust domain is the environment's mistake (exit 1, naming it), never found out after init has
    written its keys."""
    from workflows.init import initialize as run

    if trust_domain is None:
        domain = local_settings().trust_domain  # its own errors (a data directory that is a file) unprefixed
        try:
            TRUST_DOMAIN.parse(domain)
        except InvalidInput as exc:
            fail(f"TRUSTFABRIC_TRUST_DOMAIN: {exc}")
    with open_context(create=True) as ctx:
        return run(ctx, trust_domain, key_kind)


def init_cmd(
    trust_domain: str | None = typer.Option(
        None, "--trust-domain", parser=TRUST_DOMAIN, metavar="DOMAIN",
        help="e.g. example.org (default TRUSTFABRIC_TRUST_DOMAIN, else trustfabric.local; an existing one stays)"),
    key_kind: str = typer.Option("ec-p256", "--key-kind", parser=choice("ec-p256", "ec-p384"),
                                 metavar="ec-p256|ec-p384", help="CA key type"),
) -> None:
    """Create the trust domain's root and issuing CAs, the audit key and an admin API token."""
    result = initialize(trust_domain, key_kind)
    token = result.pop("admin_token")
    shown = (deliver_admin_token(str(token), result["admin_token_expires_at"], local_settings().home,
                                 json_out=machine_output()) if token else {"admin_token": None})
    if machine_output():
        emit({**result, **shown})
        return
    if result["created"]:
        print(f"initialised trust domain spiffe://{result['trust_domain']}")
    else:
        print("trust domain already initialised; nothing changed")
    if result["policy_version"]:
        print(f"activated the shipped policies (rego/) as policy version {result['policy_version']}")


def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8443, "--port", parser=PORT, metavar="PORT"),
    trust_domain: str = typer.Option(None, "--trust-domain", parser=TRUST_DOMAIN, metavar="DOMAIN",
                                     help="used when init has not run yet"),
    tls: bool = typer.Option(False, "--tls", help="HTTPS with the server's own SVID; accepts client SVIDs (mTLS)"),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="uvicorn worker processes"),
    log_level: str = typer.Option(None, "--log-level", parser=choice("debug", "info", "warning", "error"),
                                  metavar="debug|info|warning|error", help="default TRUSTFABRIC_LOG_LEVEL, info"),
) -> None:
    """Serve the API (runs init first when the trust domain does not exist yet).

    Logs are JSON lines on stderr (logfmt on a terminal; TRUSTFABRIC_LOG_FORMAT). With several workers their
    metrics are summed through a shared multiprocess directory, removed when the server stops. Connections
    are bounded (api/server.py); SIGTERM, SIGINT and SIGHUP stop it after every cleanup has run."""
    import shutil
    import signal
    import tempfile

    # The workers read the environment (uvicorn's factory): they serve the same data directory (the
    # profile's, when TRUSTFABRIC_HOME is unset), log at the same level and, with several of them, write
    # their metrics where every scrape sums them. Set before anything imports prometheus_client.
    settings = local_settings()
    os.environ.setdefault("TRUSTFABRIC_HOME", str(settings.home))
    if log_level:
        os.environ["TRUSTFABRIC_LOG_LEVEL"] = log_level
    metrics_dir = None
    if workers > 1 and not settings.metrics_multiproc_dir:
        metrics_dir = tempfile.mkdtemp(prefix="tf-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    check_listen_address(host, port)
    try:
        stopped_by = _serve(local_settings(), host, port, trust_domain, tls, workers)
    except SystemExit as exc:  # uvicorn's STARTUP_FAILURE (3): the scheme's 3 is `audit verify`'s alone
        if exc.code in (0, None):
            raise
        fail("the server did not start (the log line above says why)")
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if stopped_by is not None:  # every cleanup ran: now end as the signal asked, as uvicorn does
        signal.signal(stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), stopped_by)


def _first_steps(host: str, port: int, tls: bool, token_file: object) -> str:
    """What to do with the bootstrap token a first start made, at the address this server listens on: a first
    run showed a token and then only uvicorn's log lines (as `tctl` prints the `tsh login` line to run)."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    url = f"{'https' if tls else 'http'}://{f'[{shown}]' if ':' in shown else shown}:{port}"
    ca = " --ca CA.pem" if tls else ""  # `trustfabric bundle show --pem > CA.pem`
    sign_in = (f"`trustfabric login --server {url}{ca} --token-stdin < {token_file}`" if token_file
               else f"`trustfabric login --server {url}{ca}` (it asks for the token)")
    return f"next: sign in with it, {sign_in}, or in a browser at {url}/console/ (API docs: {url}/docs)"


def _serve(settings: Any, host: str, port: int, trust_domain: str | None, tls: bool, workers: int) -> int | None:
    """Run the server until it stops; returns the shutdown signal that stopped it, if one did (api/server.py
    catches SIGTERM, SIGINT and SIGHUP so that the cleanups here run before the process ends)."""
    import ssl

    from api.server import ConnectionLimits, serve, uvicorn_config
    from core import logs
    from workflows.context import AppContext

    logs.configure(settings.log_format, settings.log_level)
    result = initialize(trust_domain, "ec-p256")
    if result["admin_token"]:
        shown = deliver_admin_token(str(result["admin_token"]), result["admin_token_expires_at"], settings.home)
        print(_first_steps(host, port, tls, shown.get("admin_token_file")), flush=True)
    if settings.require_policy_signature and not settings.policy_verify_keys:
        print("production mode and no policy signing key (TRUSTFABRIC_POLICY_VERIFY_KEYS): no policy version can "
              "be activated; configure keys, or set TRUSTFABRIC_MODE=development (make run does)", flush=True)
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
    metrics_ctx = None
    metrics_server = None
    if settings.metrics_port:
        from api.metrics import serve_separately

        metrics_ctx = AppContext.open(settings)
        metrics_server = serve_separately(metrics_ctx, settings.metrics_host, settings.metrics_port)
        print(f"metrics on http://{settings.metrics_host}:{settings.metrics_port}/metrics", flush=True)

    def cleanup() -> None:
        try:
            if server_tls is not None:
                server_tls.cleanup()
        finally:
            if metrics_server is not None:
                metrics_server[0].shutdown()
            if metrics_ctx is not None:
                metrics_ctx.close()

    limits = ConnectionLimits(
        request_read_timeout=settings.request_read_timeout_seconds,
        keep_alive_timeout=settings.keep_alive_timeout_seconds,
        max_connections=settings.max_connections, max_header_bytes=settings.max_header_bytes,
    )
    config = uvicorn_config("api.app:app_from_env", factory=True, host=host, port=port, workers=workers,
                            log_level=settings.log_level, limits=limits,
                            log_config=None, access_log=False,  # core/logs.py and api/observe.py
                            **options)
    return serve(config, cleanup=cleanup)
