"""`trustfabric pdp`: serve the OPA REST API subset (pdp/) over the configured engine, either on fixed
modules (--rego) or following the data directory's active version and data (local)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import (
    EXIT_USAGE,
    LOCAL,
    check_listen_address,
    command,
    console,
    emit,
    fail,
    guard,
    machine_output,
    one_line_errors,
    open_context,
)
from cli.params import PORT, existing_dir, existing_file


def register(app: typer.Typer) -> None:
    @command(app, "pdp", LOCAL)
    def pdp_cmd(
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8181, "--port", parser=PORT, metavar="PORT"),
        rego: Path = typer.Option(None, "--rego", help="serve these modules (default: the active version, "
                                  "with data from the database, refreshed)", **existing_dir()),
        refresh: float = typer.Option(2.0, "--refresh", min=0.1, max=3600, help="seconds between database refreshes"),
        tls_cert: Path = typer.Option(None, "--tls-cert", **existing_file()),
        tls_key: Path = typer.Option(None, "--tls-key", **existing_file()),
    ) -> None:
        """Serve the OPA REST API subset (health, policies, data, query) over the configured policy engine.

        Bearer token from TRUSTFABRIC_PDP_TOKEN (required when binding beyond loopback)."""
        import uvicorn

        from cli.output import local_settings
        from pdp.server import create_pdp_app
        from pdp.sync import PdpSync
        from policy.engines import make_engine
        from policy.versions import load_dir

        settings = local_settings()
        token = settings.pdp_token
        if token is None and host not in ("127.0.0.1", "::1", "localhost"):
            fail("set TRUSTFABRIC_PDP_TOKEN to serve beyond loopback", EXIT_USAGE)
        if (tls_cert is None) != (tls_key is None):
            fail("--tls-cert and --tls-key go together", EXIT_USAGE)
        if tls_cert is not None and tls_key is not None:
            _check_tls_files(tls_cert, tls_key)
        check_listen_address(host, port)
        engine = guard(lambda: make_engine(settings.engines(), "pdp"))
        sync: PdpSync | None = None
        ctx_cm: Any = None
        with one_line_errors():
            if rego is not None:
                engine.load(load_dir(rego))
            else:
                ctx_cm = open_context()
                ctx = ctx_cm.__enter__()
                sync = PdpSync(ctx.db, engine, interval=refresh, clock=ctx.clock)
                sync.start()
        app_ = create_pdp_app(engine, token=token, read_only=sync is not None,
                              revision=(lambda: sync.active_hash) if sync is not None else None)
        modules = sorted(engine.modules())
        info: dict[str, Any] = {"url": f"{'https' if tls_cert else 'http'}://{host}:{port}", "modules": modules,
                "active_hash": sync.active_hash if sync else None, "token_required": token is not None}
        if machine_output():
            emit(info)
        else:
            console.print(f"pdp serving {info['url']} ({len(modules)} modules)", highlight=False)
        options: dict[str, Any] = {}
        if tls_cert is not None:
            options = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
        try:
            uvicorn.run(app_, host=host, port=port, log_level="warning", **options)
        except SystemExit as exc:  # uvicorn's STARTUP_FAILURE (3): the scheme's 3 is `audit verify`'s alone
            if exc.code in (0, None):
                raise
            fail("the PDP did not start (the log line above says why)")
        finally:
            if sync is not None:
                sync.stop()
            if ctx_cm is not None:
                ctx_cm.__exit__(None, None, None)


def _check_tls_files(cert: Path, key: Path) -> None:
    """One line and exit 1 when the certificate and key cannot serve TLS, before anything starts: uvicorn found out
    only after `pdp serving https://...` was printed, and said `SSLError: [SSL] PEM lib (_ssl.c:3926)`."""
    import ssl

    def no_passphrase() -> str:
        raise ValueError("the key is encrypted (give it unencrypted, readable by this user only)")

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key), no_passphrase)
    except ValueError as exc:
        fail(f"--tls-key {key}: {exc}")
    except ssl.SSLError as exc:
        why = "the key does not match the certificate" if exc.reason == "KEY_VALUES_MISMATCH" else \
            "not a PEM certificate and its private key"
        fail(f"--tls-cert {cert} / --tls-key {key}: {why}")
    except OSError as exc:
        fail(f"--tls-cert {cert} / --tls-key {key}: {exc.strerror or exc}")
