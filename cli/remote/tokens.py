"""`trustfabric token list|show`, through the API (admin): never the secrets, which only their holders
have. Minting and revoking run locally (cli/local/tokens.py): the first token is made before any exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.output import API, Col, View, command, emit
from cli.params import TOKEN_ID
from cli.remote.common import CaOpt, ServerOpt, client

if TYPE_CHECKING:
    from cli.remote.client import Client

TOKENS = View("API tokens", (
    Col("id", "id", kind="id", short=True), Col("role", "role"), Col("tenant", "tenant"),
    Col("subject", "subject", drop=1),
    Col("expires", "expires_at", kind="when"), Col("revoked", "revoked_at", kind="time", drop=2),
))
FULL_ID = re.compile(r"^[0-9a-f]{32}$")  # a JWT's jti; opaque tokens' 16-hex ids go through the listing
TokenId = typer.Argument(..., parser=TOKEN_ID, metavar=TOKEN_ID.metavar,
                         help="a token id (jti), or a prefix naming exactly one")


def token_id(api: Client, given: str) -> str:
    from cli.ids import resolve_lazily

    return resolve_lazily(given, lambda t: bool(FULL_ID.match(t)),
                          lambda: [t["id"] for t in api.pages("/v1/tokens")], "token")


def register(token: typer.Typer) -> None:
    @command(token, "list", API)
    def token_list(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every API token: id, role, tenant, subject, expiry (admin; never the secrets)."""
        emit(client(server, cacert).pages("/v1/tokens"), TOKENS)

    @command(token, "show", API)
    def token_show(tid: str = TokenId, server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One API token (admin)."""
        api = client(server, cacert)
        emit(api.get(f"/v1/tokens/{token_id(api, tid)}"), TOKENS)
