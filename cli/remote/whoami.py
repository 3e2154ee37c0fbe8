"""`trustfabric whoami`, through the API."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.output import API, command, emit
from cli.remote.common import CaOpt, ServerOpt, client


def register(app: typer.Typer) -> None:
    @command(app, "whoami", API)
    def whoami(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Who the server thinks you are."""
        emit(client(server, cacert).get("/v1/whoami"))
