"""`trustfabric whoami`, through the API."""

from __future__ import annotations

import typer

from cli.output import JsonOpt
from cli.remote.common import CaOpt, ServerOpt, client, show


def register(app: typer.Typer) -> None:
    @app.command("whoami")
    def whoami(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Who the server thinks you are."""
        show(client(server, cacert).get("/v1/whoami"), json_out)
