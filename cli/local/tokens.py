"""`trustfabric token create|recover|revoke` (local: on the server host, with the data directory and key store);
`token list|show` go through the API (cli/remote/tokens.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import typer

from cli.output import (
    EXIT_USAGE,
    LOCAL,
    add_group,
    command,
    emit,
    guard,
    local_operator,
    machine_output,
    open_context,
)
from cli.params import SLUG, TTL, choice
from cli.remote import tokens as remote_tokens
from core.vocabulary import MINTABLE_ROLES


def _row(row: Any) -> dict[str, Any]:
    """The API's token object (api/routes/tokens.py token_out): `token create --json` and `token show --json` agree."""
    return {"id": row.id, "role": row.role, "tenant": row.tenant, "subject": row.subject, "created_at": row.created_at,
            "expires_at": row.expires_at, "revoked_at": row.revoked_at}


def register(app: typer.Typer) -> None:
    token = add_group(app, "token", "API tokens: create, recover, revoke on the server host; list, show over the API.",
                      None)

    @command(token, "create", LOCAL)
    def token_create(
        role: str = typer.Option(..., "--role", parser=choice(*MINTABLE_ROLES), metavar="ROLE",
                                 help="|".join(MINTABLE_ROLES)),
        tenant: str = typer.Option(None, "--tenant", parser=SLUG, metavar="TENANT",
                                   help="for tenant-admin / tenant-member"),
        ttl: Any = typer.Option("24h", "--ttl", parser=TTL, metavar="TTL", help="e.g. 15m, 24h, 7d"),
        subject: str = typer.Option(None, "--subject", help="who the token is for (default: generated)"),
        description: str = typer.Option("", "--description"),
    ) -> None:
        """Mint a signed API token; the token is printed alone on the last line (shown once)."""
        from pki.tokens.service import check_role_tenant, mint_token

        assert isinstance(ttl, timedelta)
        guard(lambda: check_role_tenant(role, tenant), EXIT_USAGE)  # --tenant exactly with a tenant role
        with open_context() as ctx, ctx.db.session() as session:
            tok, row = mint_token(
                session, ctx.keystore, role=role, tenant=tenant, ttl=ttl, actor=local_operator(),
                issuer=ctx.settings.api_issuer, audience=ctx.settings.api_audience,
                max_ttl=ctx.settings.max_token_ttl, subject=subject, description=description, clock=ctx.clock,
            )
            info = _row(row)
        if machine_output():
            emit({**info, "token": tok})
            return
        from cli.humanize import when

        print(f"token {info['id']} for {info['subject']} ({info['role']}"
              f"{'@' + info['tenant'] if info['tenant'] else ''}), expires {when(info['expires_at'])}")
        print(tok)

    @command(token, "recover", LOCAL)
    def token_recover() -> None:
        """A new bootstrap admin token (run on the server host): every earlier one is revoked. Shown on a
        terminal only; otherwise written to a 0600 file in the data directory (the output says where)."""
        from cli.local.setup import deliver_admin_token
        from pki.tokens.service import recover_bootstrap_token

        with open_context() as ctx, ctx.db.session() as session:
            ttl = ctx.settings.bootstrap_token_ttl
            secret, revoked = recover_bootstrap_token(session, actor=local_operator(), ttl=ttl, clock=ctx.clock)
            expires_at, home = ctx.clock() + ttl, ctx.settings.home
        shown = deliver_admin_token(secret, expires_at, home, json_out=machine_output())
        if machine_output():
            emit({**shown, "revoked": revoked})
        elif revoked:
            print(f"revoked the earlier bootstrap token(s): {', '.join(revoked)}")

    @command(token, "revoke", LOCAL)
    def token_revoke(
        token_id: str = remote_tokens.TokenId,
        reason: str = typer.Option("", "--reason"),
    ) -> None:
        """Revoke a token by its id (jti); it is refused from the next request on."""
        from cli.ids import resolve_lazily
        from pki.tokens.service import list_tokens, revoke_token

        with open_context() as ctx, ctx.db.session() as session:
            tid = resolve_lazily(token_id, lambda t: bool(remote_tokens.FULL_ID.match(t)),
                                 lambda: [t.id for t in list_tokens(session, after=None, limit=1_000_000)], "token")
            row = revoke_token(session, tid, actor=local_operator(), reason=reason, clock=ctx.clock)
            info = _row(row)
        emit(info, remote_tokens.TOKENS)

    remote_tokens.register(token)
