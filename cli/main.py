"""The `trustfabric` entry point: the root command and its groups, registered explicitly (an unknown module
is an ImportError at start, never skipped). See cli/__init__.py for which commands run locally and which
through the API."""

from __future__ import annotations

import logging
import sys

import typer

from cli.local import agent, audit, enforcer, lab, pdp, pki, policy, setup, tokens
from cli.output import err_console
from cli.remote import fabric, grants, inventory, whoami
from core.errors import TrustfabricError

app = typer.Typer(
    name="trustfabric",
    help="Zero-trust identity, policy and audit for a multi-tenant AI cloud.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# The order is the order of `trustfabric --help`.
for _group in (setup, pki, audit, policy, pdp, inventory, grants, fabric, enforcer, tokens, whoami, lab, agent):
    _group.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run one command (`argv`, default sys.argv[1:]); exits 0, 1 with one readable line, or 2 for usage."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app(args=argv, prog_name="trustfabric", standalone_mode=True)
    except TrustfabricError as exc:
        err_console.print(f"error: {exc}", highlight=False, markup=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # one readable line, never a traceback
        logging.getLogger("trustfabric.cli").debug("unexpected error", exc_info=True)
        err_console.print(f"error: {type(exc).__name__}: {exc}", highlight=False, markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
