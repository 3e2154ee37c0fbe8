"""The audit selection options, one definition for `audit events` (over the API) and `audit export` (local), so the
two take the same filters with the same meaning (audit.actor.ActorQuery for the actor): a user swaps one verb for the
other on the same line."""

from __future__ import annotations

from datetime import datetime

import typer

from cli.output import EXIT_USAGE, fail
from cli.params import ACTION, SLUG, WHEN

TenantOpt = typer.Option(None, "--tenant", parser=SLUG, metavar="TENANT", help="only this tenant's events")
ActionOpt = typer.Option(None, "--action", parser=ACTION, metavar=ACTION.metavar,
                         help="only this action, e.g. grant.approve")
ActorOpt = typer.Option(None, "--actor", help="only this actor's: alice@acme (acme's alice), or alice (every "
                        "tenant's), cli:root")
ActorTenantOpt = typer.Option(None, "--actor-tenant", parser=SLUG, metavar="TENANT",
                              help="only actors of this tenant (with --actor: that id there)")
SinceOpt = typer.Option(None, "--since", parser=WHEN, metavar="TIME",
                        help="ISO 8601 with timezone, or a time ago (30m, 1h, 7d); inclusive")
UntilOpt = typer.Option(None, "--until", parser=WHEN, metavar="TIME",
                        help="ISO 8601 with timezone, or a time ago (30m, 1h, 7d); exclusive")


def check_window(since: datetime | None, until: datetime | None) -> None:
    """--since must come before --until (inclusive, exclusive): a window that can hold nothing is a mistake of the
    command line, refused with exit 2 before any request or export (`audit events|export|download`, `policy
    decisions`), in the words of audit.export's filter."""
    if since is not None and until is not None and since >= until:
        fail(f"--since must be before --until ({since.isoformat()} is not before {until.isoformat()})", EXIT_USAGE)
