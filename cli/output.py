"""What every CLI command shares: where it runs, its output formats, printing for people, failing in one line.

How a command adopts all of it (one decorator, then `emit`):

    from cli.output import API, Col, View, add_group, command, emit

    device = add_group(app, "device", "Devices: list, show, ...", API)   # was: typer.Typer(...) + add_typer
    DEVICES = View("devices", (Col("name", "name", kind="id"), Col("state", "state"),
                               Col("applied", "applied_at", kind="time"), Col("drift", "drift", drop=1)))

    @command(device, "list", API)            # was: @device.command("list")
    def list_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        emit(client(server, cacert).pages("/v1/devices"), DEVICES)   # was: show(items, json_out, ...)

`command(group, name, where)` registers the command under the help panel that says where it runs (API,
LOCAL, OFFLINE or NODE: `--help` shows it; `add_group(..., None)` for a group whose commands run in several
places), and gives it `--output table|json|yaml` (`-o`) and `--json` (a command that already has a
`json_out: bool = JsonOpt` parameter keeps it: it is set when either is given; `command(..., output=False)`
for one that prints a PEM, a token or serves). `emit(data, view)` then prints the API's data unchanged for
machines (`--json`: indented, sorted keys, as before; yaml), and for people a table (a list) or
`key: value` lines (a mapping) in which ids are never cut (a `kind="id"` column never shrinks; one marked `short`,
which its commands take back by unique prefix, is printed as prefixes unique in the table when the table does not
fit, and `-o wide` prints every column with ids whole, however wide), times are
local (`kind="time"`, or `kind="when"` for `in 1h 59m`), columns with the highest `drop` are hidden first
on a narrow terminal, other cells wrap at word boundaries (a word longer than its cell ends in `…`, never
broken across lines), and no Python repr (`None`, `{'a': 1}`, `datetime.datetime(...)`) can appear
(cli/humanize.py). `machine_output()` tells a command with its own human layout whether to print it.
Ids may be given back as unique prefixes: cli/ids.py. Arguments are checked while parsed, before any work
(cli/params.py: `typer.Option(..., parser=PORT, metavar=PORT.metavar)`; tests/cli/test_bad_arguments.py
then feeds each a bad value); an error ends the command with one line (`fail`, `guard`,
`one_line_errors`); `open_context()` opens the data directory of local commands (TRUSTFABRIC_HOME, else
the profile's `home`).
"""

from __future__ import annotations

import functools
import getpass
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console

from cli.params import choice
from core.errors import InvalidInput, TrustfabricError

if TYPE_CHECKING:
    from audit import Actor
    from audit.actor import ActorKind
    from store.readonly import ReadOnlyDb
    from workflows.context import AppContext

console = Console()
err_console = Console(stderr=True, soft_wrap=True)



def fit_to_terminal() -> None:
    """Size both consoles for this invocation (COLUMNS, else the terminal, else 80) and take the local time
    zone (TZ) afresh: the consoles are made once, at import, and one process may run several commands
    (tests, `main(argv)`)."""
    import shutil
    import time

    time.tzset()
    width = shutil.get_terminal_size((80, 24)).columns
    console.width = width
    err_console.width = width


T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = typer.Option(False, "--json", help="Machine-readable output (same as --output json).")

# ---- where a command runs: the help panel that groups it in `--help` (and the README's table)

Where = Literal["api", "local", "offline", "node"]
API: Where = "api"
LOCAL: Where = "local"
OFFLINE: Where = "offline"
NODE: Where = "node"
PANELS: dict[Where, str] = {
    "api": "Over the API (your token; any machine)",
    "local": "Local (on the server host: the data directory)",
    "offline": "Offline (files only: no server, no data directory)",
    "node": "On a node (GPU node or leaf: a join token, then its node SVID over mTLS)",  # <= 74: fits 80 columns
}

MIXED_PANEL = "Mixed (each command's --help panel says where it runs)"


def add_group(parent: typer.Typer, name: str, help: str, where: Where | None) -> typer.Typer:
    """A command group under `parent`, in the help panel of `where` (None: its commands run in several
    places, each says which in the group's --help)."""
    group = typer.Typer(help=help, no_args_is_help=True)
    parent.add_typer(group, name=name, rich_help_panel=PANELS[where] if where else MIXED_PANEL)
    return group


# ---- output formats

Format = Literal["table", "wide", "json", "yaml"]
FORMATS: tuple[Format, ...] = ("table", "wide", "json", "yaml")
_FORMAT: ContextVar[Format] = ContextVar("trustfabric_output", default="table")


def current_format() -> Format:
    return _FORMAT.get()


def machine_output() -> bool:
    """True when --json or --output json|yaml was given: print data, not prose (`-o wide` is for people: a table with
    every column and ids whole, as wide as it needs)."""
    return _FORMAT.get() not in ("table", "wide")


def command(group: typer.Typer, name: str, where: Where, *, output: bool = True, **kwargs: Any) -> Callable[[F], F]:
    """Register `fn` as `name` in `group` under the panel for `where`; with `output`, add --output/-o and
    --json (see the module docstring)."""

    def register(fn: F) -> F:
        target: Callable[..., Any] = _with_output(fn) if output else fn
        target.__dict__["trustfabric_where"] = where
        group.command(name, rich_help_panel=PANELS[where], **kwargs)(target)
        return fn

    return register


def _with_output(fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    has_json = "json_out" in sig.parameters
    extra = [inspect.Parameter(
        "output_format", inspect.Parameter.KEYWORD_ONLY, annotation=str,
        default=typer.Option("table", "--output", "-o", parser=choice(*FORMATS), metavar="|".join(FORMATS),
                             help="Output format (wide: every column, ids whole, however wide)."))]
    if not has_json:
        extra.append(inspect.Parameter("json_out", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=JsonOpt))

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> Any:
        fmt: Format = kw.pop("output_format", "table")
        flag = bool(kw.get("json_out") if has_json else kw.pop("json_out", False))
        if flag:
            fmt = "json"
        if has_json:
            kw["json_out"] = fmt == "json"
        token = _FORMAT.set(fmt)
        try:
            return fn(*args, **kw)
        finally:
            _FORMAT.reset(token)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
              else p for p in sig.parameters.values()]
    run.__signature__ = sig.replace(parameters=[*params, *extra])  # type: ignore[attr-defined]
    run.__annotations__ = {**getattr(fn, "__annotations__", {}), "output_format": str, "json_out": bool}
    return run


# ---- views: how a list or one object reads for people


@dataclass(frozen=True)
class Col:
    """One column: a header, the key (or a function of the item) and its kind: text, id (never shrinks,
    never cut, never hidden), time (local, to the minute; the zone in the header), when (the distance from
    now, `in 1h 59m`). `drop`: when the terminal is too narrow for every column, those with the highest
    `drop` are hidden first (0: always shown); a note names what was hidden."""

    header: str
    key: str | Callable[[Any], Any]
    kind: Literal["text", "id", "time", "when"] = "text"
    drop: int = 0
    short: bool = False  # an id a command takes back by unique prefix (cli/ids.py): shortened to one when narrow

    def value(self, item: Mapping[str, Any]) -> Any:
        return self.key(item) if callable(self.key) else item.get(self.key)

    def title(self) -> str:
        if self.kind == "time":
            from cli.humanize import zone_name

            return f"{self.header} ({zone_name()})"
        return self.header

    def cell(self, item: Mapping[str, Any]) -> str:
        from cli.humanize import local_time, relative, text

        value = self.value(item)
        if self.kind == "time" and value is not None:
            return local_time(value, seconds=False, zone=False)
        if self.kind == "when" and value is not None:
            return relative(value) or text(value)
        return text(value)


@dataclass(frozen=True)
class View:
    """A table for lists; for one object, `key: value` lines (every field, humanized)."""

    title: str
    columns: tuple[Col, ...]

    def table(self, items: Sequence[Mapping[str, Any]]) -> None:
        """The table, fitted to the terminal: when its columns do not fit with whole ids, the `short` ids are printed
        as prefixes unique within it (taken back as ids: cli/ids.py), then the columns with the highest `drop` are
        hidden, then text is cut; a note on stderr says what was shortened or hidden. `-o wide`: none of that."""
        from cli.ids import unique_prefix_length

        if not items:  # a header over nothing read as a table cut short; kubectl and gh say there is none
            console.print(f"no {self.title}", highlight=False, markup=False)
            return
        cells = {c: [c.cell(item) for item in items] for c in self.columns}
        spans = {c: _span(c.title(), cells[c], whole=c.kind in _WHOLE) for c in self.columns}
        shown = list(self.columns)
        width = console.width
        wide = current_format() == "wide"
        shortened = []
        if not wide and _needed(list(spans.values())) > table_width():
            for c in self.columns:
                if c.short and cells[c]:
                    length = unique_prefix_length(cells[c])
                    if any(len(v) > length for v in cells[c]):
                        cells[c] = [v[:length] for v in cells[c]]
                        spans[c] = _span(c.title(), cells[c], whole=True)
                        shortened.append(c.header)
        while not wide and _needed([spans[c] for c in shown]) > table_width() and any(c.drop for c in shown):
            worst = max(c.drop for c in shown)
            shown = [c for c in shown if c.drop != worst]
        hidden = [c.header for c in self.columns if c not in shown]
        emit_table(self.title, [c.title() for c in shown], [[cells[c][i] for c in shown] for i in range(len(items))],
                   ids=[i for i, c in enumerate(shown) if c.kind in _WHOLE], wide=wide)
        if (hidden or shortened) and items:
            said = [f"{', '.join(shortened)} shortened to unique prefixes"] if shortened else []
            said += [f"{', '.join(hidden)} hidden"] if hidden else []
            err_console.print(f"({'; '.join(said)} at {width} columns: widen the terminal, or use -o wide or --json)",
                              style="dim", highlight=False, markup=False)


_WHOLE = ("id", "time")  # column kinds never wrapped nor cut, header included
_GAP = 3  # between two columns: a space of padding, the rule (blank), a space of padding
LONG_WORD = 16  # a text column may be narrower than a longer word, which is then cut: `abcdefghijklmno…`


@dataclass(frozen=True)
class _Span:
    """How narrow and how wide one column of a table can be: `least`, without cutting an id, a time or a word of
    up to LONG_WORD characters; `most`, its longest line unwrapped. `whole`: an id or a time (least is most)."""

    least: int
    most: int
    whole: bool


def _span(header: str, cells: Sequence[str], *, whole: bool) -> _Span:
    lines = [line for value in (header, *cells) for line in value.splitlines()]
    most = max((cell_len(line) for line in lines), default=1)  # terminal cells: a wide character takes two
    if whole:
        return _Span(most, most, True)
    longest_word = max((cell_len(word) for line in lines for word in line.split()), default=1)
    return _Span(max(min(longest_word, LONG_WORD), 1), max(most, 1), False)


def _needed(spans: Sequence[_Span]) -> int:
    """The width columns need without cutting ids, times or words of up to LONG_WORD characters."""
    return _GAP * max(len(spans) - 1, 0) + sum(s.least for s in spans)


def _fit(spans: Sequence[_Span], room: int) -> list[int]:
    """The width of each column of a table at most `room` wide. When every column fits at its longest line, that;
    else each gets at least its `least` (no word cut), and the room beyond goes first to the columns that want the
    least more, each made as wide as its longest line: as many cells as can stay on one line do, and the others wrap
    at word boundaries only. Narrower still (only the columns no `drop` hides are left), the widest text columns are
    cut first, down to one character; ids and times never. When even that cannot fit (the ids and times alone fill
    the room), nothing is cut: the table is wider than `room` whatever is cut, so it keeps its words."""
    room -= _GAP * max(len(spans) - 1, 0)
    if sum(s.most for s in spans) <= room:
        return [s.most for s in spans]
    widths = [s.least for s in spans]
    spare = room - sum(widths)
    if spare >= 0:
        for i in sorted(range(len(spans)), key=lambda i: spans[i].most - spans[i].least):
            more = min(spans[i].most - widths[i], spare)
            widths[i] += more
            spare -= more
        return widths
    if sum(s.least if s.whole else 1 for s in spans) > room:
        return widths
    while spare < 0:
        cuttable = [i for i, s in enumerate(spans) if not s.whole and widths[i] > 1]
        widest = max(cuttable, key=lambda i: widths[i])
        widths[widest] -= 1
        spare += 1
    return widths


def emit(data: Any, view: View | None = None) -> None:
    """Print `data` in the chosen format: JSON/YAML unchanged, for people a table or `key: value` lines."""
    fmt = _FORMAT.get()
    if fmt == "json":
        emit_json(data)
    elif fmt == "yaml":
        emit_yaml(data)
    elif isinstance(data, list) and view is not None:
        view.table(data)
    else:
        emit_human(data)


def emit_human(data: Any) -> None:
    from cli.humanize import field_lines, printable, text

    if isinstance(data, Mapping):
        for line in field_lines(data):
            console.print(printable(line), highlight=False, markup=False, emoji=False, soft_wrap=True)
    elif isinstance(data, list) and data and all(isinstance(d, Mapping) for d in data):
        keys = list(dict.fromkeys(k for d in data for k in d))
        emit_table("", keys, [[text(d.get(k)) for k in keys] for d in data])
    else:
        console.print(text(data), highlight=False, markup=False, emoji=False, soft_wrap=True)


def json_value(value: Any) -> Any:
    """A value json cannot write, as the API writes it: a time in ISO 8601 UTC with `Z` (`2026-12-02T15:17:05Z`;
    a naive one is UTC, as SQLite hands stored times back), anything else as its text. str() of a time gave
    `2026-12-02 15:17:05+00:00`, or no zone at all, where `token list --json` gives the API's form."""
    from datetime import datetime

    from core.clock import iso_z

    return iso_z(value) if isinstance(value, datetime) else str(value)


def emit_json(data: Any) -> None:
    _write_out(json.dumps(data, indent=2, sort_keys=True, default=json_value) + "\n")


def emit_yaml(data: Any) -> None:
    import yaml

    plain = json.loads(json.dumps(data, default=json_value))  # the same values --json prints
    _write_out(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, default_flow_style=False))


def _write_out(text: str) -> None:
    """`text` on stdout; when its reader went away (`| head`), nothing, and the command goes on to its end, so that
    its exit code is still its answer (reader_gone)."""
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        if not reader_gone():
            raise


# ---- output whose reader went away (`trustfabric ... | head`)

_READER_GONE: list[bool] = []  # set once stdout was found to be a pipe without a reader (and sent to /dev/null)


def _broken(stream: object) -> bool:
    """Whether `stream` is a pipe (or socket) whose reader is gone: poll says POLLERR for its write end."""
    import select

    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's capture): not a broken pipe
        return False


def reader_gone() -> bool:
    """After a BrokenPipeError: whether it was our output's reader that went away (`trustfabric ... | head`), and
    if so, point stdout (and stderr, when it went too) at /dev/null, so nothing more is written to the dead pipe,
    not even by the interpreter's flush at exit. A broken pipe of anything else (a socket) is an error as any.

    What was being written is then dropped and the command runs on to its end: its exit code stays its answer
    (`audit verify` FAILED 1, `policy explain` DENY 1), never a 0 the reader's going made up."""
    import os

    if _READER_GONE:
        return True
    gone = [stream for stream in (sys.stdout, sys.stderr) if _broken(stream)]
    if sys.stdout not in gone:
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in gone:
        os.dup2(devnull, stream.fileno())
    os.close(devnull)
    _READER_GONE.append(True)
    return True


def drop_the_rest(console: Console) -> None:
    """rich's Console.on_broken_pipe (rich calls it when a write hits a closed pipe; its own exits 1 at once): when
    our output's reader went away, the console writes nothing more and the command goes on to its end (its exit
    code its answer); a broken pipe of anything else is raised, an error as any other."""
    if not reader_gone():
        raise BrokenPipeError(32, "Broken pipe")
    console.quiet = True


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
               ids: Sequence[int] = (), wide: bool = False) -> None:
    """A rich table without vertical rules, fitted to the terminal by `_fit`: the columns in `ids` hold identifiers
    (or times), never wrapped nor cut; the others wrap at word boundaries, and a word longer than its cell ends
    in `…` (as gh cuts a cell: a cut value never reads as a whole one, where a word broken across two lines does,
    and --json has every value whole). `wide`: every column at its longest line, however wide the table."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from cli.humanize import printable, text

    cells = [[printable(v) if isinstance(v, str) else text(v) for v in row] for row in rows]
    spans = [_span(col, [r[i] for r in cells], whole=i in ids) for i, col in enumerate(columns)]
    widths = [s.most for s in spans] if wide else _fit(spans, table_width())
    total = sum(widths) + _GAP * max(len(widths) - 1, 0)
    # wider than the terminal only when its ids and times are (or -o wide): then at that width (rich would shrink
    # every column, ids included, to the terminal's), its lines left whole for the terminal to fold
    wider = total if total > table_width() else None
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  width=wider)
    for col, span, width in zip(columns, spans, widths, strict=True):
        if span.whole:
            table.add_column(col, no_wrap=True, min_width=width, overflow="ignore")
        else:
            table.add_column(col, width=width, overflow="ellipsis")
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # as text: a cell is never rich markup (`[/]`, `[link=...]`)
    console.print(table, width=table_width(), crop=wider is None)


def table_width() -> int:
    """The width a table may take: one column short of the terminal's. A line that fills the last column leaves
    the terminal waiting to wrap, and many terminals then join what comes next (the hidden-columns note on
    stderr) to that line, or copy the two as one line."""
    return max(console.width - 1, 1)


# ---- exit codes: one scheme for every command (the README's "Exit codes"), as CONVENTIONS.md says: 0 ok, 1 failure,
# 2 usage; a script tells a wrong command line (2) from a command that failed or answered no (1)

EXIT_OK = 0  # done; a question answered yes: ALLOW, verified OK, tests pass, OPEN, signed in
EXIT_FAILURE = 1  # the command failed or its answer is no: DENY, FAILED verification, failing tests, a mismatch, a
# denied request, BLOCKED, a domain error, the server unreachable or refusing (HTTP 4xx/5xx), any unexpected error
EXIT_USAGE = 2  # the command line was wrong, before any work: a bad option or value, a missing argument, a file
# argument that cannot be used as what its option says (not a key, unreadable)
EXIT_UNPROVEN = 3  # `audit verify` only (beyond the conventions): nothing found altered, the selection not provable
EXIT_ABORTED = 130  # interrupted (Ctrl-C, end of input at a prompt)


def answer_no() -> NoReturn:
    """End a command whose answer (already printed) is no: exit EXIT_FAILURE, without an `error:` line."""
    raise typer.Exit(EXIT_FAILURE)


# ---- failing in one line


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """One line `error: message` on stderr, then exit `code`: EXIT_FAILURE, or EXIT_USAGE when the message says
    the command line was wrong (options that do not go together, a file argument that cannot be used)."""
    err_console.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(code)


def check_listen_address(host: str, port: int) -> None:
    """One line and exit 1 when HOST:PORT cannot be listened on (in use, not this host's), before a server command
    does any work: uvicorn finds out only when it binds, logs it and exits with its own code 3 (STARTUP_FAILURE),
    which this CLI's scheme gives to `audit verify` alone."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


@contextmanager
def one_line_errors(code: int = EXIT_FAILURE) -> Iterator[None]:
    """A domain error or an unreadable file ends the command with one line and `code` (EXIT_FAILURE; EXIT_USAGE
    around the reading of a file argument, before any work)."""
    try:
        yield
    except TrustfabricError as exc:
        fail(str(exc), code)
    except BrokenPipeError as exc:
        if reader_gone():
            raise  # our output's reader went away (`| head`): cli/main.py ends quietly, no error line
        fail(f"{type(exc).__name__}: {exc}", code)  # a pipe nobody reads that is not our output: a failed write
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}", code)


def guard(fn: Callable[[], T], code: int = EXIT_FAILURE) -> T:
    """fn(), or one line and exit `code` on a domain error or an OSError (one_line_errors)."""
    with one_line_errors(code):
        return fn()
    raise AssertionError("unreachable")  # pragma: no cover


# ---- local commands: the data directory and the operator


@contextmanager
def open_context(*, create: bool = False) -> Iterator[AppContext]:
    """The data directory of a local command: TRUSTFABRIC_HOME, else the profile's `home`, else ./.trustfabric."""
    from workflows.context import AppContext

    settings = local_settings()
    if not create and settings.database_url is None and not settings.home.exists():
        # AppContext says "run `trustfabric init` first": on a laptop away from the server host that makes a second
        # trust domain; the likelier fix is to run the command where the data directory is
        raise InvalidInput(f"{settings.home} does not exist: this command runs on the server host, with its data "
                           "directory (cd to the folder the server runs in, set TRUSTFABRIC_HOME, or `trustfabric "
                           "login --home DIR`); a new deployment starts with `trustfabric init`")
    ctx = AppContext.open(settings, create=create)
    try:
        yield ctx
    finally:
        ctx.close()


def read_local(fast: Callable[[ReadOnlyDb], T], full: Callable[[AppContext], T]) -> T:
    """What a read-only local command reads: `fast` over the database opened read-only through sqlite3 (the
    command then starts without SQLAlchemy, workflows/readonly.py), else (PostgreSQL, another schema, no
    database yet) `full` over the full context, as every local command opens it. Both run the domain's one
    SQL text, so they give the same answer."""
    from workflows.readonly import open_read_only

    db = open_read_only(local_settings())
    if db is not None:
        try:
            return fast(db)
        finally:
            db.close()
    with open_context() as ctx:
        return full(ctx)


def local_settings() -> Any:
    """Settings from the environment; with TRUSTFABRIC_HOME unset, the selected profile's `home`."""
    from dataclasses import replace
    from pathlib import Path

    from cli.config import selected_profile
    from workflows.settings import ClientSettings, Settings

    settings = Settings.from_env()
    if ClientSettings.from_env().home is None:
        home = selected_profile().home
        if home:
            settings = replace(settings, home=Path(home).expanduser())
    if settings.database_url is None and settings.home.exists() and not settings.home.is_dir():
        # said here, once, for every local command: each failed on its own (`NotADirectoryError: ... trustfabric.db`)
        raise InvalidInput(f"{settings.home} is not a folder: the data directory is one (TRUSTFABRIC_HOME, else the "
                           "profile's home, else ./.trustfabric)")
    return settings


def local_operator(kind: ActorKind = "admin") -> Actor:
    """Who acts when a local CLI command changes state: whoever can read the data directory and key store
    is the operator, recorded as cli:<user> (admin, or security for policy changes). A platform actor, of no
    tenant: the server host's operator acts for the platform even when the command touches one tenant's objects
    (the event's own `tenant` says whose)."""
    from audit import Actor

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Actor(id=f"cli:{user}", kind=kind)
