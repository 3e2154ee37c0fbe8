"""What `audit export` (on the server host) and `audit download` (the same export over the API, from an auditor's
own machine) share, so that swapping one verb for the other on the same line gives the same files and the same
words: the options beyond the selection (that is cli/audit_filters.py), the checks made before any work, the
files (written as FILE.part, renamed only once whole: never a partial file under the name asked for) and what is
said about them once written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import typer

from cli.audit_filters import check_window
from cli.output import EXIT_USAGE, emit, err_console, fail, machine_output
from cli.params import choice, existing_file, new_file
from core.errors import InvalidInput

FORMAT_NAMES = ("jsonl", "csv", "ocsf")  # audit.export.FORMATS (checked when a command runs: its import is heavier)
DECISIONS_SUFFIX = ".decisions.jsonl"

OutOpt = typer.Option(..., "--out", help="file to write (replaced only when the export succeeds)", **new_file())
FormatOpt = typer.Option("jsonl", "--format", parser=choice(*FORMAT_NAMES), metavar="|".join(FORMAT_NAMES))
WithDecisionsOpt = typer.Option(
    False, "--with-decisions",
    help=f"also write the policy decision records (same --since/--until/--tenant) to <out>{DECISIONS_SUFFIX}",
)
SinceCheckpointOpt = typer.Option(
    None, "--since-checkpoint", help="a checkpoint kept earlier: the export carries the consistency proof from it",
    **existing_file(),
)

SELECTION_HELP = (
    "Filters as `audit events` takes them. A --tenant or --action selection is proven complete by `audit verify`; "
    "one narrowed by --actor/--actor-tenant is not (nothing counts an actor's events): each event in it is still "
    "proven authentic, in its place and that actor's, but `audit verify` says UNPROVEN (exit 3)."
)


def help_of(command: Any) -> str:
    """A command's --help: its docstring, then what a selection proves (SELECTION_HELP)."""
    import inspect

    return f"{inspect.cleandoc(command.__doc__ or '')}\n\n{SELECTION_HELP}"


@dataclass(frozen=True)
class Wanted:
    """An export as the command line asks for it, checked."""

    out: Path
    fmt: str
    since: datetime | None
    until: datetime | None
    tenant: str | None
    action: str | None
    actor: str | None
    actor_tenant: str | None
    with_decisions: bool
    kept_note: str | None  # the text of --since-checkpoint

    @property
    def part(self) -> Path:
        return self.out.with_name(self.out.name + ".part")

    @property
    def decisions(self) -> Path:
        return self.out.with_name(self.out.name + DECISIONS_SUFFIX)

    @property
    def decisions_part(self) -> Path:
        return self.decisions.with_name(self.decisions.name + ".part")

    def selection(self) -> dict[str, Any]:
        """The filter's fields (audit.export.ExportFilter's, POST /v1/audit/exports' names)."""
        return {"since": self.since, "until": self.until, "tenant": self.tenant, "action": self.action,
                "actor": self.actor, "actor_tenant": self.actor_tenant}


def wanted(
    out: Path, fmt: str, *, since: datetime | None, until: datetime | None, tenant: str | None, action: str | None,
    actor: str | None, actor_tenant: str | None, with_decisions: bool, since_checkpoint: Path | None,
) -> Wanted:
    """The export asked for, or one line and exit 2 (usage) before any work: a format that is none, a window that
    can hold nothing, an actor that cannot be, a --since-checkpoint that cannot be read."""
    from audit.actor import ActorQuery
    from audit.export.formats import FORMATS

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}", EXIT_USAGE)
    check_window(since, until)
    actors = ActorQuery(actor, actor_tenant)
    if actors.given and (problem := actors.problem()) is not None:
        fail(f"export: {problem}", EXIT_USAGE)
    note = None
    if since_checkpoint is not None:
        try:
            note = read_checkpoint(since_checkpoint)
        except InvalidInput as exc:  # the file given cannot be read: usage, before any work
            fail(str(exc), EXIT_USAGE)
    return Wanted(out, fmt, since, until, tenant, action, actor, actor_tenant, with_decisions, note)


def read_checkpoint(path: Path) -> str:
    """The text of a checkpoint note the auditor kept; InvalidInput naming the option and the file if unreadable."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"--since-checkpoint {path}: cannot read it ({exc})") from None


@contextmanager
def staged(want: Wanted) -> Iterator[tuple[IO[bytes], IO[bytes] | None]]:
    """The export's file (and the decisions file) open as <name>.part, for writing and reading back; renamed to the
    names asked for when the block ends without an error, removed however it ends otherwise (an error, a failed
    check, Ctrl-C): never a partial file under the name asked for, nor a .part left behind."""
    try:
        with open(want.part, "w+b") as fh, \
                (open(want.decisions_part, "w+b") if want.with_decisions else nullcontext()) as dec:
            yield fh, dec
        want.part.replace(want.out)
        if want.with_decisions:
            want.decisions_part.replace(want.decisions)
    finally:
        want.part.unlink(missing_ok=True)
        want.decisions_part.unlink(missing_ok=True)


@dataclass(frozen=True)
class Written:
    """What an export holds, as the exporter counted it (local) or as read back from the file (downloaded)."""

    events: int
    tree_size: int
    start: int
    end: int
    gaps: int
    checkpoint: str  # the signed note
    root_hash: str  # hex
    decisions: tuple[int, str] | None = None  # the decision records' count and SHA-256


def report(want: Wanted, written: Written) -> None:
    """What both commands say once the files are in place: a line for each file (or the --json object), and the
    note that a selection narrowed by actor will verify UNPROVEN, said where it is made, not first at verify time."""
    summary: dict[str, Any] = {
        "out": str(want.out),
        "format": want.fmt,
        "events": written.events,
        "tree_size": written.tree_size,
        "range": [written.start, written.end],
        "gaps": written.gaps,
        "checkpoint": written.checkpoint,
    }
    if written.decisions is not None:
        count, sha256 = written.decisions
        summary["decisions"] = {"out": str(want.decisions), "count": count, "sha256": sha256}
    if machine_output():
        emit(summary)
    else:
        print(
            f"exported {written.events} event(s) of {written.tree_size} to {want.out} ({want.fmt}); checkpoint "
            f"size {written.tree_size} root {written.root_hash}"
        )
        if written.decisions is not None:
            print(f"exported {written.decisions[0]} decision record(s) to {want.decisions} "
                  f"(sha256 {written.decisions[1]})")
    from audit.actor import ActorQuery

    actors = ActorQuery(want.actor, want.actor_tenant)
    if actors.given:
        from audit.verify.steps import actor_unproven

        err_console.print(f"note: {actor_unproven(actors)}: `audit verify` says UNPROVEN (exit 3)",
                          highlight=False, markup=False, soft_wrap=True)
