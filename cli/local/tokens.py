"""`trustfabric token create|revoke` (local: on the server host, with the data directory and key store)."""

from __future__ import annotations

import typer

from cli.output import JsonOpt, emit_json, local_operator, open_context
from cli.remote.common import show
from core.clock import parse_ttl
from core.vocabulary import MINTABLE_ROLES, one_of


def register(app: typer.Typer) -> None:
    token = typer.Typer(help="API tokens (run on the server host: needs the data directory).",
                        no_args_is_help=True)
    app.add_typer(token, name="token")

    @token.command("create")
    def token_create(
        role: str = typer.Option(..., "--role", help=one_of(MINTABLE_ROLES)),
        tenant: str = typer.Option(None, "--tenant", help="for tenant-admin / tenant-member"),
        ttl: str = typer.Option("24h", "--ttl", help="e.g. 15m, 24h, 7d"),
        subject: str = typer.Option(None, "--subject", help="who the token is for (default: generated)"),
        description: str = typer.Option("", "--description"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Mint a signed API token; the token is printed alone on the last line (shown once)."""
        from pki.tokens.service import mint_token

        with open_context() as ctx, ctx.db.session() as session:
            tok, row = mint_token(
                session, ctx.keystore, role=role, tenant=tenant, ttl=parse_ttl(ttl), actor=local_operator(),
                issuer=ctx.settings.api_issuer, audience=ctx.settings.api_audience,
                max_ttl=ctx.settings.max_token_ttl, subject=subject, description=description, clock=ctx.clock,
            )
        if json_out:
            emit_json({"id": row.id, "role": row.role, "tenant": row.tenant, "subject": row.subject,
                       "expires_at": row.expires_at, "token": tok})
            return
        print(f"token {row.id} for {row.subject} ({row.role}{'@' + row.tenant if row.tenant else ''}), "
              f"expires {row.expires_at}")
        print(tok)

    @token.command("recover")
    def token_recover(json_out: bool = JsonOpt) -> None:
        """A new bootstrap admin token (run on the server host): every earlier one is revoked. Shown on a
        terminal only; otherwise written to a 0600 file in the data directory (the output says where)."""
        from cli.local.setup import deliver_admin_token
        from pki.tokens.service import recover_bootstrap_token

        with open_context() as ctx, ctx.db.session() as session:
            ttl = ctx.settings.bootstrap_token_ttl
            secret, revoked = recover_bootstrap_token(session, actor=local_operator(), ttl=ttl, clock=ctx.clock)
            expires_at, home = ctx.clock() + ttl, ctx.settings.home
        shown = deliver_admin_token(secret, expires_at, home, json_out=json_out)
        if json_out:
            emit_json({**shown, "revoked": revoked})
        elif revoked:
            print(f"revoked the earlier bootstrap token(s): {', '.join(revoked)}")

    @token.command("revoke")
    def token_revoke(token_id: str, reason: str = typer.Option("", "--reason"), json_out: bool = JsonOpt) -> None:
        """Revoke a token by its id (jti); it is refused from the next request on."""
        from pki.tokens.service import revoke_token

        with open_context() as ctx, ctx.db.session() as session:
            row = revoke_token(session, token_id, actor=local_operator(), reason=reason, clock=ctx.clock)
        show({"id": row.id, "revoked_at": str(row.revoked_at)}, json_out)
