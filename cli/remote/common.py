"""What the CLI commands that talk to the API share: --server/--cacert options, the client, output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from cli.output import emit_json, emit_table

if TYPE_CHECKING:
    from cli.remote.client import Client

ServerOpt = typer.Option(None, "--server", help="API URL (env TRUSTFABRIC_SERVER, config file, or local default)")
CaOpt = typer.Option(None, "--cacert", help="CA bundle (PEM) to verify an HTTPS server")


def client(server: str | None, cacert: str | None = None) -> Client:
    from cli.remote.client import Client

    return Client.from_env(server, ca_file=cacert)


def show(data: Any, json_out: bool, *, title: str = "", columns: Sequence[str] = (),
         rows: Sequence[Sequence[Any]] | None = None) -> None:
    """JSON for machines, a table (or key: value lines) for people."""
    if json_out:
        emit_json(data)
        return
    if rows is not None:
        emit_table(title, columns, rows)
        return
    if isinstance(data, dict):
        for key, value in data.items():
            print(f"{key}: {value}")
    else:
        print(data)
