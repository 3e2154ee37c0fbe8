"""`trustfabric audit export | verify | public-key`.

`verify` works offline: it opens no database and no key store, only the export file and the public key.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import typer

from api.cli_common import JsonOpt, emit_json, err_console, fail, open_context
from core.clock import parse_when
from core.errors import TrustfabricError


def _when(value: str | None, name: str) -> datetime | None:
    return None if value is None else parse_when(value, name)


def export_cmd(
    out: Path = typer.Option(..., "--out", help="file to write (replaced only when the export succeeds)"),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl | csv | ocsf"),
    since: str | None = typer.Option(None, "--since", help="ISO 8601 with timezone, inclusive"),
    until: str | None = typer.Option(None, "--until", help="ISO 8601 with timezone, exclusive"),
    tenant: str | None = typer.Option(None, "--tenant", help="only this tenant's events"),
    action: str | None = typer.Option(None, "--action", help="only this action, e.g. svid.issue"),
    with_decisions: bool = typer.Option(
        False,
        "--with-decisions",
        help="also write the policy decision records (same --since/--until/--tenant) to <out>.decisions.jsonl",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Export the audit log with its signed checkpoint and everything needed to verify it offline."""
    import audit
    from api.cli_common import local_operator
    from api.routes.audit import log_origin
    from audit.checkpoint import audit_signer
    from audit.export import FORMATS, ExportFilter, export_events

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}", code=2)
    filters = ExportFilter(since=_when(since, "since"), until=_when(until, "until"), tenant=tenant, action=action)
    filters.check()
    tmp = out.with_name(out.name + ".part")
    dec_out = out.with_name(out.name + ".decisions.jsonl")
    dec_tmp = dec_out.with_name(dec_out.name + ".part")
    decisions = None
    if with_decisions:
        from policy.decisionlog import export_filter

        export_filter(filters.since, filters.until, tenant)  # a bad filter writes nothing
    with open_context() as ctx:
        signer = audit_signer(ctx.keystore)
        show = sys.stderr.isatty() and not json_out
        try:
            with open(tmp, "wb") as fh:
                if show:
                    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

                    with Progress(
                        "exporting",
                        BarColumn(),
                        MofNCompleteColumn(),
                        TimeRemainingColumn(),
                        console=err_console,
                        transient=True,
                    ) as bar:
                        task = bar.add_task("export", total=None)
                        result = export_events(
                            ctx.db,
                            signer,
                            fh,
                            fmt=fmt,
                            filters=filters,
                            origin=log_origin(ctx),
                            clock=ctx.clock,
                            progress=lambda done, total: bar.update(task, completed=done, total=total),
                        )
                else:
                    result = export_events(
                        ctx.db,
                        signer,
                        fh,
                        fmt=fmt,
                        filters=filters,
                        origin=log_origin(ctx),
                        clock=ctx.clock,
                    )
            if with_decisions:
                from policy.decisionlog import export_decisions

                with open(dec_tmp, "wb") as fh:
                    decisions = export_decisions(
                        ctx.db, fh, since=filters.since, until=filters.until, tenant=tenant, clock=ctx.clock
                    )
            summary_event: dict[str, object] = {
                "filter": filters.as_json(),
                "out": out.name,
                "tree_size": result.tree_size,
            }
            if decisions is not None:
                summary_event["decisions"] = {"out": dec_out.name, "count": decisions.count, "sha256": decisions.sha256}
            with ctx.db.session() as session:  # audited once the export exists: a failed one leaves no event
                audit.record(
                    session,
                    actor=local_operator(),  # the operator who ran it, as for every other local CLI change
                    action="audit.export",
                    object_type="export",
                    object_id=fmt,
                    tenant=tenant,
                    summary=summary_event,
                )
            tmp.replace(out)
            if decisions is not None:
                dec_tmp.replace(dec_out)
        finally:
            tmp.unlink(missing_ok=True)
            dec_tmp.unlink(missing_ok=True)
    summary = {
        "out": str(out),
        "format": fmt,
        "events": result.events,
        "tree_size": result.tree_size,
        "range": [result.start, result.end],
        "gaps": result.gaps,
        "checkpoint": result.checkpoint.note,
    }
    if decisions is not None:
        summary["decisions"] = {"out": str(dec_out), "count": decisions.count, "sha256": decisions.sha256}
    if json_out:
        emit_json(summary)
    else:
        print(
            f"exported {result.events} event(s) of {result.tree_size} to {out} ({fmt}); checkpoint "
            f"size {result.tree_size} root {result.checkpoint.root_hash}"
        )
        if decisions is not None:
            print(f"exported {decisions.count} decision record(s) to {dec_out} (sha256 {decisions.sha256})")


def verify_cmd(
    file: Path = typer.Argument(..., help="an export written by `trustfabric audit export`"),
    public_key: Path = typer.Option(..., "--public-key", help="the audit public key (PEM from `audit public-key`)"),
    json_out: bool = JsonOpt,
) -> None:
    """Verify an export offline; exit 0 when intact, 1 naming the first bad event."""
    from audit.checkpoint import load_public_key
    from audit.errors import VerificationError
    from audit.verify import verify_export

    try:
        key = load_public_key(public_key.read_bytes())
        report = verify_export(file, key)
    except VerificationError as exc:
        if json_out:
            emit_json({"ok": False, "kind": exc.kind, "index": exc.index, "line": exc.line, "reason": str(exc)})
            raise typer.Exit(1) from None
        fail(f"FAILED ({exc.kind}): {exc}")
    except (OSError, TrustfabricError) as exc:
        if json_out:
            emit_json({"ok": False, "kind": "unreadable", "index": None, "line": None, "reason": str(exc)})
            raise typer.Exit(1) from None
        fail(f"cannot verify: {exc}")
    if json_out:
        emit_json(
            {
                "ok": True,
                "origin": report.origin,
                "tree_size": report.tree_size,
                "events": report.events,
                "root": report.root.hex(),
                "range": list(report.range),
                "filter": report.filter,
            }
        )
        return
    # what was proven: the export's selection (from its header) as well as the checkpoint it matches
    chosen = ", ".join(f"{k} {v}" for k, v in sorted(report.filter.items()) if v is not None) or "no filter"
    print(
        f"OK: {report.events} event(s) verified against the signed checkpoint of {report.origin} "
        f"(tree size {report.tree_size}, root {report.root.hex()}); selection: {chosen}, "
        f"sequence range [{report.range[0]}, {report.range[1]})"
    )


def public_key_cmd(
    note: bool = typer.Option(False, "--note", help="print the signed-note verifier key instead of PEM"),
) -> None:
    """Print the audit public key, for auditors to keep outside the system."""
    from api.routes.audit import log_origin
    from audit.checkpoint import audit_signer, ed25519_public_key, public_key_pem, verifier_key

    with open_context() as ctx:
        signer = audit_signer(ctx.keystore)
        if note:
            print(verifier_key(log_origin(ctx), ed25519_public_key(signer)))
        else:
            sys.stdout.write(public_key_pem(signer))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Tamper-evident audit log: export, verify offline, public key.", no_args_is_help=True)
    group.command("export")(export_cmd)
    group.command("verify")(verify_cmd)
    group.command("public-key")(public_key_cmd)
    app.add_typer(group, name="audit")
