"""What every CLI command shares: opening the context, printing for people or --json, failing in one line."""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from core.errors import TrustfabricError

if TYPE_CHECKING:
    from audit import Actor
    from audit.actor import ActorKind
    from workflows.context import AppContext

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

T = TypeVar("T")

JsonOpt = typer.Option(False, "--json", help="Machine-readable output.")


@contextmanager
def open_context(*, create: bool = False) -> Iterator[AppContext]:
    from workflows.context import AppContext
    from workflows.settings import Settings

    ctx = AppContext.open(Settings.from_env(), create=create)
    try:
        yield ctx
    finally:
        ctx.close()


def local_operator(kind: ActorKind = "admin") -> Actor:
    """Who acts when a local CLI command changes state: whoever can read the data directory and key store
    is the operator, recorded as cli:<user> (admin, or security for policy changes)."""
    from audit import Actor

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Actor(id=f"cli:{user}", kind=kind)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*[("" if v is None else str(v)) for v in row])
    console.print(table)


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(code)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A domain error or an unreadable file ends the command with one line and exit 1."""
    try:
        yield
    except TrustfabricError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}", 1)


def guard(fn: Callable[[], T]) -> T:
    with one_line_errors():
        return fn()
    raise AssertionError("unreachable")  # pragma: no cover
