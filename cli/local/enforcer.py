"""`trustfabric enforcer compile|plan|apply|rollback|verify|show|status`.

All but `status` run on the server host, against the data directory: they compile from the database (with a
progress display on the terminal, compiles can take seconds) and publish through the same services the
server's reconciler uses. `status` reads GET /v1/devices through the API, like the console.
Semantics of apply, plan and rollback: workflows/enforcement.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from cli.output import JsonOpt, console, emit_json, emit_table, err_console, fail, guard, local_operator, open_context
from cli.remote.common import CaOpt, ServerOpt

if TYPE_CHECKING:
    from enforcer.reconcile import Outcome, Reconciler
    from workflows.context import AppContext

T = TypeVar("T")


@contextmanager
def _progress(what: str, quiet: bool) -> Iterator[None]:
    """A spinner with the elapsed time on the terminal while `what` runs (nothing with --json or no tty)."""
    if quiet or not err_console.is_terminal:
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True) as bar:
        bar.add_task(what, total=None)
        yield


def _with_reconciler(what: str, quiet: bool, fn: Callable[[AppContext, Reconciler], T]) -> T:
    from workflows.enforcement import make_reconciler

    def run() -> T:
        with open_context() as ctx:
            rec = make_reconciler(ctx)
            rec.actor = local_operator("admin")
            try:
                with _progress(what, quiet):
                    return fn(ctx, rec)
            finally:
                rec.close()
    return guard(run)


def _outcome(out: Outcome, json_out: bool) -> None:
    if json_out:
        emit_json(out.to_dict())
    else:
        what = (f"full compile of {len(out.changed)} device(s)" if out.full
                else f"incremental compile, {len(out.changed)} device(s) changed")
        console.print(f"{what} in {out.compile_seconds * 1000:.1f} ms", highlight=False)
        for device, version in sorted(out.published.items()):
            console.print(f"published {device} version {version}", highlight=False)
        for device in out.held:
            console.print(f"held {device} (pending plan; `trustfabric enforcer apply --device {device}`)",
                          highlight=False)
        for device in out.retired:
            console.print(f"retired {device} (left the fabric)", highlight=False)
        if not (out.published or out.held or out.retired or out.error):
            console.print("every device is up to date", highlight=False)
    if out.error:
        fail(out.error)


def register(app: typer.Typer) -> None:
    enforcer = typer.Typer(help="Device rule sets: compile, plan, apply, roll back, verify, show, status.",
                           no_args_is_help=True)
    app.add_typer(enforcer, name="enforcer")

    @enforcer.command("compile")
    def compile_cmd(full: bool = typer.Option(False, "--full", help="from scratch, not incrementally"),
                    json_out: bool = JsonOpt) -> None:
        """Compile from the database once and publish what changed (in manual mode: hold it as the plan)."""
        out = _with_reconciler("compiling", json_out, lambda _ctx, rec: rec.run_once("trustfabric enforcer compile",
                                                                                      full=full))
        _outcome(out, json_out)

    @enforcer.command("apply")
    def apply_cmd(device: list[str] = typer.Option([], "--device", help="only this device (unpins it); "
                                                   "repeatable"), json_out: bool = JsonOpt) -> None:
        """Publish the pending plan: every changed device, or the named ones (unpinning them)."""
        out = _with_reconciler("compiling", json_out, lambda _ctx, rec: rec.apply(device or None))
        _outcome(out, json_out)

    @enforcer.command("plan")
    def plan_cmd(staged: str = typer.Option(None, "--staged", help="a candidate policy version (not active)"),
                 json_out: bool = JsonOpt) -> None:
        """What applying would change on each device, against what it last applied."""
        from workflows.enforcement import plans

        out = _with_reconciler("compiling", json_out, lambda ctx, rec: [p.summary() for p in plans(ctx, rec, staged)])
        if json_out:
            emit_json(out)
            return
        if not out:
            console.print("no device would change", highlight=False)
            return
        emit_table(f"plan{f' (staged: policy version {staged})' if staged else ''}",
                   ("device", "rules +", "rules -", "leaks +", "leaks -", "budget before", "after", "limit"),
                   [(p["device"], p["rules_added"], p["rules_removed"], p["leaks_added"], p["leaks_removed"],
                     p["budget"]["before"], p["budget"]["after"], p["budget"]["limit"]) for p in out])

    @enforcer.command("rollback")
    def rollback_cmd(device: str = typer.Option(..., "--device"),
                     to: int = typer.Option(..., "--to", help="an earlier version of the device"),
                     reason: str = typer.Option(None, "--reason"), json_out: bool = JsonOpt) -> None:
        """Publish an earlier version's content as a new version and pin the device there."""
        from enforcer import service

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.session() as session:
                row = service.rollback(session, device, to, actor=local_operator("admin"), now=ctx.clock(),
                                       budget=ctx.settings.budget(), reason=reason)
                return {"device": device, "version": row.version, "content_hash": row.content_hash, "pinned": True,
                        "rolled_back_to": to}
        out = guard(run)
        if json_out:
            emit_json(out)
        else:
            console.print(f"{device}: version {out['version']} = version {to}'s content, pinned "
                          f"(`trustfabric enforcer apply --device {device}` unpins)", highlight=False)

    @enforcer.command("verify")
    def verify_cmd(json_out: bool = JsonOpt) -> None:
        """Walk every flow through the published rule sets and compare with the active policy; exit 1 naming
        each mismatch (the flow, the policy's answer and the devices')."""
        from workflows.enforcement import verify_published

        findings, mismatches = _with_reconciler("verifying", json_out, verify_published)
        if json_out:
            emit_json({"ok": not findings and not mismatches,
                       "findings": [{"device": f.device, "problem": f.problem} for f in findings],
                       "mismatches": [{"src": m.src, "dst": m.dst, "proto": m.proto, "port": m.port,
                                       "family": m.family, "policy": "allow" if m.policy else "deny",
                                       "devices": "allow" if m.devices else "deny", "detail": m.detail}
                                      for m in mismatches]})
        else:
            for f in findings:
                err_console.print(f"{f.device}: {f.problem}", highlight=False, markup=False)
            for m in mismatches:
                err_console.print(f"mismatch: {m}", highlight=False, markup=False)
            if not findings and not mismatches:
                console.print("ok: the published rule sets do what the active policy says", highlight=False)
        if findings or mismatches:
            raise typer.Exit(1)

    @enforcer.command("show")
    def show_cmd(device: str = typer.Option(..., "--device"),
                 fmt: str = typer.Option("ir", "--format", help="openflow | nvue | nv-set | nft | ir"),
                 version: int = typer.Option(None, "--version", help="an earlier version (default: desired)"),
                 json_out: bool = JsonOpt) -> None:
        """A device's published rule set in its native format."""
        from enforcer import service
        from enforcer.fabric_db import compile_fabric_of
        from pki.service import trust_domain
        from workflows.enforcement import FORMATS, render

        if fmt not in FORMATS:
            fail(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}", 2)

        def run() -> tuple[Any, str]:
            with open_context() as ctx, ctx.db.read_session() as session:
                row = service.version_row(session, service.check_device(device), version)
                rs = service.ruleset_of(row)
                fabric = compile_fabric_of(session, trust_domain(session) or "")
                return row, render(rs, fmt, fabric)
        row, text = guard(run)
        if json_out:
            emit_json({"device": device, "version": row.version, "content_hash": row.content_hash, "format": fmt,
                       "text": text})
        else:
            print(text, end="")

    @enforcer.command("status")
    def status_cmd(server: str = ServerOpt, cacert: str = CaOpt, json_out: bool = JsonOpt) -> None:
        """Every device: desired vs applied version, pin, pending plan, drift, last apply (through the API)."""
        from cli.remote.common import client

        rows = client(server, cacert).get("/v1/devices")
        if json_out:
            emit_json(rows)
            return
        emit_table("devices", ("device", "desired", "applied", "in sync", "pinned", "pending", "drift", "applied at",
                               "last error"),
                   [(r["device"] + ("" if r["in_fabric"] else " (retired)"), r["desired_version"],
                     r["applied_version"] or "-", "yes" if r["in_sync"] else "no", "yes" if r["pinned"] else "",
                     (r["pending_hash"] or "")[:12], len(r["drift"]) or "", r["applied_at"] or "",
                     r["last_error"] or "") for r in rows])
