"""What the CLI commands that talk to the API share: --server/--cacert options and the client."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from cli.params import URL, existing_file

if TYPE_CHECKING:
    from cli.remote.client import Client

ServerOpt = typer.Option(None, "--server", parser=URL, metavar=URL.metavar,
                         help="API URL, e.g. https://tf.example.org:8443 (else TRUSTFABRIC_SERVER, the profile, "
                              "http://127.0.0.1:8443)")
CaOpt = typer.Option(None, "--cacert", "--ca", help="CA bundle (PEM) to verify an HTTPS server",
                     **existing_file())


def client(server: str | None, cacert: object = None) -> Client:
    from cli.remote.client import Client

    return Client.from_env(server, ca_file=str(cacert) if cacert else None)
