"""The `trustfabric` entry point: the root command and its groups, registered explicitly (an unknown module
is an ImportError at start, never skipped). See cli/__init__.py for which commands run locally and which
through the API; `--help` groups every command under the panel that says so."""

from __future__ import annotations

import logging
import os
import sys
from functools import cache

import typer
from typer._click.core import Command

from cli import config
from cli.helptext import reflow_tree
from cli.local import agent, audit, enforcer, lab, pdp, pki, policy, setup, tokens
from cli.output import (
    EXIT_ABORTED,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    drop_the_rest,
    err_console,
    fit_to_terminal,
    reader_gone,
)
from cli.remote import fabric, grants, inventory, login, whoami
from core.errors import TrustfabricError

VERSION = "0.1.0"  # the package's version (pyproject.toml); tests/cli check they agree

app = typer.Typer(
    name="trustfabric",
    help="Zero-trust identity, policy and audit for a multi-tenant AI cloud.\n\n"
         "Each command says where it runs: over the API (your token, any machine), locally on the server "
         "host (the data directory: TRUSTFABRIC_HOME or the profile's), offline (files only), or on a node "
         "(the agent).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _version(value: bool) -> None:
    if value:
        print(f"trustfabric {VERSION}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    ctx: typer.Context,
    profile: str = typer.Option(None, "--profile", "-p", metavar="NAME",
                                help="config-file profile to use (else TRUSTFABRIC_PROFILE, else the current one)"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """A profile named on the command line must exist for every command but `login` (which makes it), the offline
    ones and those TRUSTFABRIC_HOME points at a data directory included: a mistyped name is a usage error before
    any work, never a command run silently without the profile its caller asked for. Except a help request
    (`-p typo tenant --help`): help does no work, and its text is what such a caller needs (a later lookup of the
    profile, should `--help` have been an option's value, is the same usage error)."""
    config.select(profile)
    asks_help = bool(set(ctx.obj or ()) & set(ctx.help_option_names))  # ctx.obj: main()'s argv
    if profile is not None and ctx.invoked_subcommand != "login" and not asks_help:
        config.selected_profile()


# The order is the order of `trustfabric --help`.
for _group in (login, setup, pki, audit, policy, pdp, inventory, grants, fabric, enforcer, tokens, whoami, lab, agent):
    _group.register(app)


_ROOT_OPTIONS = ("--profile",)  # the root's options a user may give after the command, as kubectl and tsh allow


def _root_option_first(args: list[str], option: str) -> str:
    """The command line with the root option (and its value) moved before the command, as it must be given."""
    import shlex

    rest, moved = list(args), [option, "NAME"]
    for i, arg in enumerate(rest):
        if arg == option:
            moved[1:] = rest[i + 1:i + 2] or ["NAME"]
            del rest[i:i + 2]
            break
        if arg.startswith(option + "="):
            moved[1] = arg.partition("=")[2]
            del rest[i]
            break
    return shlex.join(["trustfabric", *moved, *rest])


@cache
def _command() -> Command:
    """The click command tree typer builds from `app`, built once per process: typer builds the whole tree on
    every call (~0.02 s), and the tests run hundreds of commands in one process. Its help texts wrap at the
    terminal's width (cli/helptext.py)."""
    command = typer.main.get_command(app)
    reflow_tree(command)
    return command


def main(argv: list[str] | None = None) -> None:
    """Run one command (`argv`, default sys.argv[1:]) and exit as cli.output's EXIT_* say (CONVENTIONS.md: 0 ok,
    1 failure, 2 usage): 0 done / yes; 1 failure -- the answer is no (the command says so), a domain error, the
    server unreachable or refusing, any error (one readable line, never a traceback); 2 usage -- a bad argument
    (one line naming it, before any work); 3 unproven (`audit verify`); 130 interrupted."""
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption
    from typer._click.utils import PacifyFlushWrapper
    from typer.exceptions import Abort

    if argv is None:  # a process of its own (not a test calling in), still single-threaded: safe to setenv
        # regorus reports errors through Rust's anyhow, which captures a stack backtrace with each one when
        # RUST_BACKTRACE is set (and symbolises it at the first, ~0.15 s); the policy commands strip it from
        # what they print. RUST_LIB_BACKTRACE covers library errors only (panics still follow
        # RUST_BACKTRACE); an operator who sets it keeps their choice.
        os.environ.setdefault("RUST_LIB_BACKTRACE", "0")
    fit_to_terminal()
    # every rich console of the process (ours, typer's help) meets a closed pipe as cli.output says, not by exiting 1
    from rich.console import Console

    Console.on_broken_pipe = drop_the_rest  # type: ignore[method-assign,assignment]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config.select(None)
    try:
        args = sys.argv[1:] if argv is None else argv
        code = _command()(args=args, prog_name="trustfabric", standalone_mode=False, obj=tuple(args))
        try:
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not in the interpreter's exit
        except BrokenPipeError:
            if not reader_gone():
                raise
            # the command ran to its end: its exit code is its answer (`audit verify --json` FAILED: 1), not 0
    except SystemExit as exc:
        # click answers a write to a closed pipe (EPIPE) under the command with exit 1 and no word, its streams
        # wrapped to stay quiet at exit (PacifyFlushWrapper, set there only): answered as below
        if exc.code == EXIT_FAILURE and isinstance(sys.stdout, PacifyFlushWrapper):
            if reader_gone():
                sys.exit(EXIT_OK)
            broken = exc.__context__  # what click answered: a pipe nobody reads that is not our output (a file
            if isinstance(broken, OSError):  # to write that is one, a socket): a failed write, with its line
                err_console.print(f"error: {type(broken).__name__}: {broken}", highlight=False, markup=False,
                                  soft_wrap=True)
        raise
    except BrokenPipeError as exc:
        if not reader_gone():  # not our output's reader (a socket): an error as any other
            err_console.print(f"error: {type(exc).__name__}: {exc}", highlight=False, markup=False, soft_wrap=True)
            sys.exit(EXIT_FAILURE)
        # the reader of our output stopped reading (`trustfabric audit events | head`) while a plain print was
        # writing (rich's consoles and emit drop the rest and run on to the command's own code, cli/output.py): no
        # message and no traceback; and exit 0, the reader having taken what it wanted
        sys.exit(EXIT_OK)
    except NoArgsIsHelpError as exc:
        if exc.ctx is not None:
            print(exc.ctx.get_help())
        sys.exit(EXIT_OK)
    except ClickException as exc:
        where = getattr(exc, "ctx", None)
        hint = f" (see `{where.command_path} --help`)" if where is not None else ""
        message = " ".join(exc.format_message().split())
        if isinstance(exc, NoSuchOption) and exc.option_name in _ROOT_OPTIONS:
            # kubectl and tsh take their profile/context option anywhere; here it belongs to the root command
            hint = (f": {exc.option_name} is an option of trustfabric itself, given before the command: "
                    f"`{_root_option_first(args, exc.option_name)}`")
        err_console.print(f"error: {message}{hint}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)  # click's errors are all the command line's: parsing it, cli/params.py
    except TrustfabricError as exc:
        err_console.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(EXIT_FAILURE)
    except (KeyboardInterrupt, EOFError, Abort):
        err_console.print("aborted", highlight=False, markup=False)
        sys.exit(EXIT_ABORTED)
    except Exception as exc:  # one readable line, never a traceback
        logging.getLogger("trustfabric.cli").debug("unexpected error", exc_info=True)
        first = str(exc).strip().split("\n", 1)[0]  # a driver's message runs on (hints, a link to its docs)
        err_console.print(f"error: {type(exc).__name__}: {first}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(EXIT_FAILURE)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
