"""`trustfabric audit events|show|checkpoint|download`, through the API: what an auditor or a tenant reads from
their own machine (a tenant sees only its own tenant's events). `download` writes what the local `audit export`
writes (cli/audit_exports.py, shared), from POST /v1/audit/exports; offline verification is in cli/local/audit.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer

from audit.actor import qualified_id
from cli.audit_exports import (
    FormatOpt,
    OutOpt,
    SinceCheckpointOpt,
    Wanted,
    WithDecisionsOpt,
    Written,
    help_of,
    report,
    staged,
    wanted,
)
from cli.audit_filters import ActionOpt, ActorOpt, ActorTenantOpt, SinceOpt, TenantOpt, UntilOpt, check_window
from cli.output import API, Col, View, command, emit, err_console, guard, machine_output
from cli.remote.common import CaOpt, ServerOpt, client

if TYPE_CHECKING:
    from cli.remote.client import Client


def _actor(event: dict[str, Any]) -> str:
    """`alice@acme` for acme's alice, the id alone for an actor of no tenant."""
    return qualified_id(str(event["actor"]["id"]), event["actor"].get("tenant"))


EVENTS = View("audit events", (
    Col("seq", "seq", kind="id"), Col("time", "ts", kind="time"), Col("actor", _actor, drop=1),
    Col("tenant", "tenant", drop=2), Col("action", "action"),
    Col("object", lambda e: f"{e['object']['type']}:{e['object']['id']}"), Col("reason", "reason", drop=3),
))


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def export_request(want: Wanted) -> dict[str, Any]:
    """The body of POST /v1/audit/exports for the export asked for (its fields are the selection's names)."""
    body: dict[str, Any] = {"format": want.fmt, "include_decisions": want.with_decisions}
    body.update({k: _iso(v) if isinstance(v, datetime) else v for k, v in want.selection().items() if v is not None})
    if want.kept_note is not None:
        body["since_checkpoint"] = want.kept_note
    return body


def download(api: Client, want: Wanted, fh: IO[bytes], dec_fh: IO[bytes] | None) -> Written:
    """Receive the export into `fh` (with --with-decisions, the multipart answer split into `fh` and `dec_fh`), then
    read both back as `audit export` would have counted them. A TrustfabricError for anything short of two whole
    files (the server's refusal, an answer cut short or not the files asked for): the caller keeps nothing then."""
    from cli.remote.client import ApiError
    from cli.remote.multipart import MultipartSplitter, boundary_of, filename_of

    splitters: list[MultipartSplitter] = []
    progress = _Progress()

    def receive(content_type: str) -> Any:
        boundary = boundary_of(content_type)
        if dec_fh is None:
            if boundary is not None:
                raise ApiError("the server answered with several files where the export alone was asked for")
            return progress.counting(fh.write)
        if boundary is None:
            raise ApiError(f"the server answered {content_type or 'an untyped body'}, not the export and its "
                           "decision records (multipart/mixed)")
        taken: set[str] = set()

        def start(headers: dict[str, str]) -> IO[bytes]:
            # the API names the decisions part audit-export.decisions.jsonl (api/routes/audit.py)
            which = "decisions" if (filename_of(headers) or "").endswith(".decisions.jsonl") else "export"
            if which in taken:
                raise ApiError(f"the server's answer holds a second {which} file")
            taken.add(which)
            return dec_fh if which == "decisions" else fh

        splitter = MultipartSplitter(boundary, start)
        splitters.append(splitter)
        return progress.counting(splitter.feed)

    with progress:
        api.download("/v1/audit/exports", export_request(want), receive)
    for splitter in splitters:
        splitter.close()
        if splitter.parts != 2:
            raise ApiError(f"the server's answer holds {splitter.parts} file(s), not the export and its decisions")
    return _read_back(fh, dec_fh)


def _read_back(fh: IO[bytes], dec_fh: IO[bytes] | None) -> Written:
    """What the received files hold, read back as a whole (VerificationError or DecisionExportError, with the
    line, for a file that is not one: nothing is kept then)."""
    from audit.errors import VerificationError
    from audit.export.summary import summarize

    fh.flush()
    fh.seek(0)
    try:
        got = summarize(fh)
    except VerificationError as exc:
        raise type(exc)(f"the server's answer is not a whole export: {exc}") from None
    decisions = None
    if dec_fh is not None:
        from policy.decisionlog import verify_decision_export

        dec_fh.flush()
        dec_fh.seek(0)
        checked = verify_decision_export(dec_fh)
        decisions = (checked.count, checked.sha256)
    return Written(events=got.events, tree_size=got.tree_size, start=got.start, end=got.end, gaps=got.gaps,
                   checkpoint=got.checkpoint, root_hash=got.root_hash, decisions=decisions)


class _Progress:
    """The bytes received so far, on a terminal (stderr) only; nothing for --json or a pipe."""

    def __init__(self) -> None:
        import sys

        self.bar: Any = None
        if sys.stderr.isatty() and not machine_output():
            from rich.progress import DownloadColumn, Progress, SpinnerColumn, TransferSpeedColumn

            self.bar = Progress("downloading", SpinnerColumn(), DownloadColumn(), TransferSpeedColumn(),
                                console=err_console, transient=True)
            self.task = self.bar.add_task("download", total=None)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def counting(self, sink: Any) -> Any:
        if self.bar is None:
            return sink

        def write(piece: bytes) -> None:
            sink(piece)
            self.bar.update(self.task, advance=len(piece))

        return write


def register(audit: typer.Typer) -> None:
    @command(audit, "events", API)
    def events_cmd(
        tenant: str = TenantOpt, action: str = ActionOpt, actor: str = ActorOpt, actor_tenant: str = ActorTenantOpt,
        since: Any = SinceOpt, until: Any = UntilOpt,
        limit: int = typer.Option(100, "--limit", min=1, max=1000, help="events shown (one page)"),
        newest: bool = typer.Option(False, "--newest", help="newest first (the latest events; default oldest first)"),
        after: int | None = typer.Option(
            None, "--after", metavar="SEQ", min=0, max=2**53,  # the API's bound (api/routes/audit.py MAX_INDEX)
            help="the next page: the events past event SEQ in the order shown (with --newest, older ones); "
                 "SEQ is the last one a page showed"),
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Audit events, one page: oldest first, or the latest with --newest; --after SEQ goes on from a page's last
        event (a tenant principal sees its own tenant's only)."""
        check_window(since, until)
        api = client(server, cacert)
        query = {"tenant": tenant, "action": action, "actor": actor, "actor_tenant": actor_tenant,
                 "since": _iso(since), "until": _iso(until), "order": "desc" if newest else None}
        page = api.get("/v1/audit/events", **query, limit=limit, after=after)
        emit(page["items"], EVENTS)
        # a full page may be all there is: one more event asked for tells "the log ends here" from "it goes on"
        cursor = page.get("next_cursor")
        if cursor and api.get("/v1/audit/events", **query, limit=1, cursor=cursor)["items"]:
            last = page["items"][-1]
            which = "older" if newest else "more"
            again = " --newest" if newest else ""
            err_console.print(
                f"({which} events follow seq {last['seq']}: the next page is `audit events{again} --after "
                f"{last['seq']}` (same filters); or narrow with --since/--until, --tenant or --action, raise --limit "
                "(up to 1000), or `trustfabric audit download` for all)",
                highlight=False, markup=False, soft_wrap=True)

    @command(audit, "show", API)
    def show_cmd(seq: int = typer.Argument(..., min=0, help="the event's sequence number"),
                 server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """One audit event: who did what to which object, why, and its place in the hash chain."""
        emit(client(server, cacert).get(f"/v1/audit/events/{seq}"), EVENTS)

    @command(audit, "checkpoint", API)
    def checkpoint_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """The latest signed checkpoint note (keep it: later exports must extend it)."""
        cp = client(server, cacert).get("/v1/audit/checkpoint")
        if machine_output():
            emit(cp)
        else:
            print(cp["note"], end="" if cp["note"].endswith("\n") else "\n")

    def download_cmd(
        out: Path = OutOpt, fmt: str = FormatOpt,
        since: datetime | None = SinceOpt, until: datetime | None = UntilOpt, tenant: str | None = TenantOpt,
        action: str | None = ActionOpt, actor: str | None = ActorOpt, actor_tenant: str | None = ActorTenantOpt,
        with_decisions: bool = WithDecisionsOpt, since_checkpoint: Path | None = SinceCheckpointOpt,
        server: str = ServerOpt, cacert: Path = CaOpt,
    ) -> None:
        """Download an export from the API: the files `audit export` writes on the server host, from your own
        machine with your token (a tenant's token: its own tenant's events and decisions only)."""
        want = wanted(out, fmt, since=since, until=until, tenant=tenant, action=action, actor=actor,
                      actor_tenant=actor_tenant, with_decisions=with_decisions, since_checkpoint=since_checkpoint)
        api = client(server, cacert)
        with staged(want) as (fh, dec_fh):
            written = guard(lambda: download(api, want, fh, dec_fh))
        report(want, written)

    command(audit, "download", API, help=help_of(download_cmd))(download_cmd)
