"""`trustfabric audit export | verify | public-key` (`audit download`, the export over the API, is in cli/remote).

`verify` works offline: it opens no database and no key store, only the export file and the public key
(and, with --since-checkpoint, a checkpoint the auditor kept). Exit codes (cli.output's EXIT_*): 0 proven
intact, 1 FAILED (names the first bad event; a file that is no export is not an intact one), 2 usage (a bad
argument; a --public-key that is no key or cannot be read, a --since-checkpoint that is no checkpoint signed by
that key or cannot be read: checked before the export is read), 3 unproven (nothing found altered, but the
export cannot prove its selection complete; beyond CONVENTIONS.md's 0/1/2, for `audit verify` alone).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from cli.audit_exports import (
    FormatOpt,
    OutOpt,
    SinceCheckpointOpt,
    WithDecisionsOpt,
    Written,
    help_of,
    read_checkpoint,
    report,
    staged,
    wanted,
)
from cli.audit_filters import ActionOpt, ActorOpt, ActorTenantOpt, SinceOpt, TenantOpt, UntilOpt
from cli.output import (
    EXIT_FAILURE,
    EXIT_UNPROVEN,
    EXIT_USAGE,
    LOCAL,
    OFFLINE,
    add_group,
    answer_no,
    command,
    emit,
    err_console,
    fail,
    guard,
    machine_output,
    open_context,
)
from cli.params import existing_file
from core.errors import TrustfabricError

if TYPE_CHECKING:
    from workflows.exports import ExportOutcome

if TYPE_CHECKING:  # imported when a command runs: `trustfabric --help` stays light
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from audit.note import Checkpoint


def export_cmd(
    out: Path = OutOpt, fmt: str = FormatOpt,
    since: datetime | None = SinceOpt, until: datetime | None = UntilOpt, tenant: str | None = TenantOpt,
    action: str | None = ActionOpt, actor: str | None = ActorOpt, actor_tenant: str | None = ActorTenantOpt,
    with_decisions: bool = WithDecisionsOpt, since_checkpoint: Path | None = SinceCheckpointOpt,
) -> None:
    """Export the audit log with its signed checkpoint and everything needed to verify it offline (from the data
    directory; `audit download` writes the same files over the API)."""
    from audit.export import ExportFilter
    from cli.output import local_operator
    from workflows.exports import check_filters, export_audit

    want = wanted(out, fmt, since=since, until=until, tenant=tenant, action=action, actor=actor,
                  actor_tenant=actor_tenant, with_decisions=with_decisions, since_checkpoint=since_checkpoint)
    filters = ExportFilter(**want.selection())
    # a bad filter (--since not before --until, an --action that is none, an --actor that cannot be) is the command
    # line's: usage, and nothing written
    guard(lambda: check_filters(filters, with_decisions=with_decisions), EXIT_USAGE)
    with open_context() as ctx:
        show = sys.stderr.isatty() and not machine_output()
        with staged(want) as (fh, dec_fh):
            def run(progress: Callable[[int, int], None] | None) -> ExportOutcome:
                return export_audit(
                    ctx, fh, fmt=fmt, filters=filters, actor=local_operator(),  # the operator who ran it
                    decisions_out=dec_fh, file_names=(want.out.name, want.decisions.name), progress=progress,
                    since_checkpoint=want.kept_note,
                )

            if show:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

                with Progress(
                    "exporting", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err_console,
                    transient=True,
                ) as bar:
                    task = bar.add_task("export", total=None)
                    outcome = run(lambda done, total: bar.update(task, completed=done, total=total))
            else:
                outcome = run(None)
    result, decisions = outcome.events, outcome.decisions
    report(want, Written(
        events=result.events, tree_size=result.tree_size, start=result.start, end=result.end, gaps=result.gaps,
        checkpoint=result.checkpoint.note, root_hash=result.checkpoint.root_hash,
        decisions=(decisions.count, decisions.sha256) if decisions is not None else None,
    ))


def _kept_checkpoint(path: Path, key: Ed25519PublicKey) -> Checkpoint:
    """A checkpoint note the auditor kept, verified with the audit public key (CheckpointError naming the option and
    the file if not, as --public-key's: an auditor holds several files beside the export)."""
    from audit.errors import CheckpointError
    from audit.note import verify_checkpoint

    try:
        return verify_checkpoint(read_checkpoint(path), key)
    except CheckpointError as exc:
        raise CheckpointError(f"--since-checkpoint {path}: {exc}") from None


def _cannot_verify(exc: Exception, code: int) -> NoReturn:
    """`audit verify` could not verify (no FAILED verdict): one line, or the JSON object, then exit `code`."""
    if machine_output():
        emit({"ok": False, "kind": "unreadable", "index": None, "line": None, "reason": str(exc)})
        raise typer.Exit(code) from None
    fail(f"cannot verify: {exc}", code)


def verify_cmd(
    file: Path = typer.Argument(..., help="an export written by `trustfabric audit export`", **existing_file()),
    public_key: Path = typer.Option(..., "--public-key", help="the audit public key (PEM from `audit public-key`)",
                                    **existing_file()),
    since_checkpoint: Path | None = typer.Option(
        None,
        "--since-checkpoint",
        help="a signed checkpoint kept earlier (`audit checkpoint`): the export must extend it",
        **existing_file(),
    ),
) -> None:
    """Verify an export offline; exit 0 when proven intact, 1 naming the first bad event (FAILED), 2 when the key or
    the kept checkpoint cannot be used (unreadable, not a key, not a checkpoint that key signed), 3 when unproven."""
    from audit.errors import CheckpointError, Unproven, VerificationError
    from audit.note import load_public_key
    from audit.verify import verify_export

    try:  # the files that say what to trust, before the export is read: one that cannot be used is usage
        try:
            key = load_public_key(public_key.read_bytes())
        except CheckpointError as exc:  # which file: an auditor holds several beside the export
            raise CheckpointError(f"--public-key {public_key}: {exc}") from None
        kept = _kept_checkpoint(since_checkpoint, key) if since_checkpoint else None
    except (OSError, TrustfabricError) as exc:
        _cannot_verify(exc, EXIT_USAGE)
    try:
        report = verify_export(file, key, since=kept)
    except Unproven as exc:
        if machine_output():
            checked = exc.report  # what was verified: every event's proof held, completeness did not
            emit({"ok": False, "kind": exc.kind, "index": None, "line": None, "reason": str(exc),
                  "events": checked.events, "tree_size": checked.tree_size, "origin": checked.origin,
                  "cautions": list(checked.cautions)})
        else:
            err_console.print(f"UNPROVEN: nothing was found altered in {exc.report.events} event(s), but {exc}",
                              highlight=False, markup=False)
            _print_cautions(exc.report.cautions)
        raise typer.Exit(EXIT_UNPROVEN) from None
    except VerificationError as exc:
        if machine_output():
            emit({"ok": False, "kind": exc.kind, "index": exc.index, "line": exc.line, "reason": str(exc)})
            answer_no()
        fail(f"FAILED ({exc.kind}): {exc}")
    except (OSError, TrustfabricError) as exc:  # the export could not be read through: a failure, not FAILED
        _cannot_verify(exc, EXIT_FAILURE)
    if machine_output():
        emit(
            {
                "ok": True,
                "origin": report.origin,
                "tree_size": report.tree_size,
                "events": report.events,
                "root": report.root.hex(),
                "range": list(report.range),
                "filter": report.filter,
                "signed_at": report.signed_at,  # emit writes the API's `Z` form
                "cautions": list(report.cautions),
            }
        )
        return
    # what was proven: the export's selection (from its header) as well as the checkpoint it matches
    chosen = ", ".join(f"{k} {v}" for k, v in sorted(report.filter.items()) if v is not None) or "no filter"
    signed = f", signed {report.signed_at.isoformat()}" if report.signed_at else ", no signed time"
    print(
        f"OK: {report.events} event(s) verified against the signed checkpoint of {report.origin} "
        f"(tree size {report.tree_size}, root {report.root.hex()}{signed}); selection: {chosen}, "
        f"sequence range [{report.range[0]}, {report.range[1]})"
    )
    _print_cautions(report.cautions)


def _print_cautions(cautions: tuple[str, ...]) -> None:
    """Proven intact, yet to beware of (a CSV from before formula guarding): on stderr, so stdout stays the verdict."""
    for caution in cautions:
        err_console.print(f"caution: {caution}", highlight=False, markup=False)


def public_key_cmd(
    note: bool = typer.Option(False, "--note", help="print the signed-note verifier key instead of PEM"),
) -> None:
    """Print the audit public key, for auditors to keep outside the system."""
    from audit.checkpoint import audit_signer, ed25519_public_key, public_key_pem, verifier_key
    from workflows.exports import log_origin

    with open_context() as ctx:
        signer = audit_signer(ctx.keystore)
        if note:
            print(verifier_key(log_origin(ctx), ed25519_public_key(signer)))
        else:
            sys.stdout.write(public_key_pem(signer))


def register(app: typer.Typer) -> None:
    from cli.remote import audit as remote_audit

    group = add_group(app, "audit", "Tamper-evident audit log: events, show, checkpoint, export (on the server host) "
                      "or download (over the API), verify offline, public key.", None)
    command(group, "export", LOCAL, help=help_of(export_cmd))(export_cmd)
    command(group, "verify", OFFLINE)(verify_cmd)
    command(group, "public-key", LOCAL, output=False)(public_key_cmd)
    remote_audit.register(group)
