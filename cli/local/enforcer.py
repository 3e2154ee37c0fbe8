"""`trustfabric enforcer compile|plan|apply|rollback|verify|show|versions|status`.

All but `status` run on the server host, against the data directory: they compile from the database (with a
progress display on the terminal, compiles can take seconds) and publish through the same services the
server's reconciler uses. `status` reads GET /v1/devices through the API, like the console and `device list`.
Semantics of apply, plan and rollback: workflows/enforcement.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from cli.output import (
    API,
    EXIT_USAGE,
    LOCAL,
    Col,
    View,
    add_group,
    answer_no,
    command,
    console,
    emit,
    err_console,
    fail,
    guard,
    local_operator,
    machine_output,
    open_context,
)
from cli.params import DEVICE, POLICY_REF, choice
from cli.remote.common import CaOpt, ServerOpt

if TYPE_CHECKING:
    from enforcer.reconcile import Outcome, Reconciler
    from workflows.context import AppContext

T = TypeVar("T")
FORMATS = ("ir", "openflow", "nvue", "nv-set", "nft")  # workflows.enforcement.FORMATS (kept light: no import)
DeviceOpt = typer.Option(..., "--device", parser=DEVICE, metavar=DEVICE.metavar, help="nic:<node> or leaf:<name>")
PLANS = View("plan", (
    Col("device", "device", kind="id"), Col("rules +", "rules_added"), Col("rules -", "rules_removed"),
    Col("leaks +", "leaks_added"), Col("leaks -", "leaks_removed"),
    Col("budget before", lambda p: p["budget"]["before"], drop=1), Col("after", lambda p: p["budget"]["after"]),
    Col("limit", lambda p: p["budget"]["limit"], drop=1),
    Col("withheld (over budget)", lambda p: _withheld(p.get("withheld"))),
))


def _withheld(rows: list[dict[str, Any]] | None) -> str:
    """`acme: 3 entries (96)`, per tenant whose entries a device withholds to fit its budget (enforcer.fairshare)."""
    return ", ".join(f"{w['tenant']}: {w['entries']} {'entry' if w['entries'] == 1 else 'entries'} ({w['cost']})"
                     for w in rows or ())
WITHHELD = View("withheld (over budget: denied where a device withholds what allows them)", (
    Col("source", "src", kind="id"), Col("destination", "dst", kind="id"),
    Col("proto", "proto"), Col("port", "port"), Col("IP", "family"),
    Col("withheld on", lambda m: ", ".join(m["withheld_on"])),
))
FINDINGS = View("devices not verifiable", (Col("device", "device", kind="id"), Col("problem", "problem")))
MISMATCHES = View("mismatches", (
    Col("source", "src", kind="id"), Col("destination", "dst", kind="id"),
    Col("flow", lambda m: f"{m['proto']}/{m['port']}"), Col("IP", lambda m: f"v{m['family']}", drop=2),
    Col("policy", "policy"), Col("devices", "devices"), Col("where", "detail", drop=1),
))
VERSIONS = View("versions", (
    Col("version", "version"), Col("content hash", "content_hash", kind="id", drop=2),
    Col("published", "published_at", kind="time"), Col("by", "published_by", drop=1), Col("cause", "cause"),
))


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


def _verify(ctx: AppContext, rec: Reconciler) -> tuple[list[Any], list[Any], list[tuple[Any, list[str]]]]:
    """verify_published, with the mismatches that only a device's fair-share withholding explains (policy allow,
    devices deny, every entry allowing the flow withheld on its way: enforcer.fairshare.withheld_on) set apart,
    each with those devices."""
    from enforcer.fairshare import withheld_on
    from enforcer.service import withheld_keys
    from workflows.enforcement import verify_published

    findings, mismatches = verify_published(ctx, rec)
    compiled = rec.compiled
    if not mismatches or compiled is None:
        return findings, mismatches, []
    with ctx.db.read_session() as session:
        held = withheld_keys(session)
    if not held:
        return findings, mismatches, []
    drift: list[Any] = []
    withheld: list[tuple[Any, list[str]]] = []
    for m in mismatches:
        devices = withheld_on(compiled, held, m.src, m.dst, m.proto, m.port) if m.policy and not m.devices else []
        if devices:
            withheld.append((m, devices))
        else:
            drift.append(m)
    return findings, drift, withheld


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


def _outcome(out: Outcome) -> None:
    if machine_output():
        emit(out.to_dict())
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
        for device, rows in sorted(out.withheld.items()):
            console.print(f"over budget, fitted: {device} withholds {_withheld(rows)} (the tenants over their "
                          "fair share; their newest flows are denied there)", highlight=False)
        if not (out.published or out.held or out.retired or out.error):
            console.print("every device is up to date", highlight=False)
    if out.error:
        fail(out.error)


def register(app: typer.Typer) -> None:
    enforcer = add_group(app, "enforcer",
                         "Device rule sets: compile, plan, apply, roll back, verify, show, versions, status.", None)

    @command(enforcer, "compile", LOCAL)
    def compile_cmd(full: bool = typer.Option(False, "--full", help="from scratch, not incrementally")) -> None:
        """Compile from the database once and publish what changed (in manual mode: hold it as the plan)."""
        out = _with_reconciler("compiling", machine_output(),
                               lambda _ctx, rec: rec.run_once("trustfabric enforcer compile", full=full))
        _outcome(out)

    @command(enforcer, "apply", LOCAL)
    def apply_cmd(device: list[str] = typer.Option([], "--device", parser=DEVICE, metavar=DEVICE.metavar,
                                                   help="only this device (unpins it); repeatable")) -> None:
        """Publish the pending plan: every changed device, or the named ones (unpinning them)."""
        out = _with_reconciler("compiling", machine_output(), lambda _ctx, rec: rec.apply(list(device) or None))
        _outcome(out)

    @command(enforcer, "plan", LOCAL)
    def plan_cmd(staged: str = typer.Option(None, "--staged", parser=POLICY_REF, metavar=POLICY_REF.metavar,
                                            help="a candidate policy version (not active)")) -> None:
        """What applying would change on each device, against what it last applied."""
        from workflows.enforcement import plans

        out = _with_reconciler("compiling", machine_output(),
                               lambda ctx, rec: [p.summary() for p in plans(ctx, rec, staged)])
        if machine_output():
            emit(out)
        elif not out:
            console.print("no device would change", highlight=False)
        else:
            View(f"plan{f' (staged: policy version {staged})' if staged else ''}", PLANS.columns).table(out)

    @command(enforcer, "rollback", LOCAL)
    def rollback_cmd(device: str = DeviceOpt,
                     to: int = typer.Option(..., "--to", min=1, help="an earlier version of the device"),
                     reason: str = typer.Option(None, "--reason")) -> None:
        """Publish an earlier version's content as a new version and pin the device there."""
        from enforcer import service

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.session() as session:
                row = service.rollback(session, device, to, actor=local_operator("admin"), now=ctx.clock(),
                                       budget=ctx.settings.budget(), reason=reason)
                return {"device": device, "version": row.version, "content_hash": row.content_hash, "pinned": True,
                        "rolled_back_to": to}
        out = guard(run)
        if machine_output():
            emit(out)
        else:
            console.print(f"{device}: version {out['version']} = version {to}'s content, pinned "
                          f"(`trustfabric enforcer apply --device {device}` unpins)", highlight=False)

    @command(enforcer, "verify", LOCAL)
    def verify_cmd() -> None:
        """Walk every flow through the published rule sets and compare with the active policy; exit 1 when any
        device disagrees, listing each mismatch (the flow, the policy's answer and the devices') on stdout."""
        findings, mismatches, withheld = _with_reconciler("verifying", machine_output(), _verify)

        def row(m: Any) -> dict[str, Any]:
            return {"src": m.src, "dst": m.dst, "proto": m.proto, "port": m.port, "family": m.family,
                    "policy": "allow" if m.policy else "deny", "devices": "allow" if m.devices else "deny",
                    "detail": m.detail}

        # the command's answer, on stdout like any command's (an error that stops it is the one line on stderr);
        # a flow denied only because a device over its budget withholds what allows it is no mismatch: it is
        # named apart, with those devices (fail closed, audited: `enforcer status` shows what each withholds)
        out: dict[str, Any] = {
            "ok": not findings and not mismatches,
            "findings": [{"device": f.device, "problem": f.problem} for f in findings],
            "mismatches": [row(m) for m in mismatches],
            "withheld": [{**row(m), "withheld_on": devices} for m, devices in withheld]}
        if machine_output():
            emit(out)
        elif out["ok"]:
            if withheld:
                WITHHELD.table(out["withheld"])
            console.print("ok: the published rule sets do what the active policy says" + (
                f", but for {len(withheld)} flow(s) withheld on devices over their budget (fair share)"
                if withheld else ""), highlight=False)
        else:
            if withheld:
                WITHHELD.table(out["withheld"])
            if findings:
                FINDINGS.table(out["findings"])
            if mismatches:
                MISMATCHES.table(out["mismatches"])
            console.print(f"not ok: {len(findings)} device(s) not verifiable, {len(mismatches)} flow(s) where the "
                          "devices do not do what the active policy says", highlight=False)
        if not out["ok"]:
            answer_no()

    @command(enforcer, "show", LOCAL)
    def show_cmd(device: str = DeviceOpt,
                 fmt: str = typer.Option("ir", "--format", parser=choice(*FORMATS), metavar="|".join(FORMATS),
                                         help="the device's native format, or the IR"),
                 version: int = typer.Option(None, "--version", min=1, help="an earlier version (default: desired)"),
                 ) -> None:
        """A device's published rule set in its native format (--json: with its version and hash)."""
        from enforcer import service
        from enforcer.fabric_db import compile_fabric_of
        from pki.service import trust_domain
        from workflows.enforcement import check_format, render

        # a format the device's kind (its name's prefix) has none of is the command line's: usage, before any work
        guard(lambda: check_format(device, device.partition(":")[0], fmt), EXIT_USAGE)

        def run() -> tuple[Any, str]:
            with open_context() as ctx, ctx.db.read_session() as session:
                row = service.version_row(session, device, version)
                rs = service.ruleset_of(row)
                fabric = compile_fabric_of(session, trust_domain(session) or "")
                return row, render(rs, fmt, fabric)
        row, text = guard(run)
        if machine_output():
            emit({"device": device, "version": row.version, "content_hash": row.content_hash, "format": fmt,
                  "text": text})
        else:
            print(text, end="")

    @command(enforcer, "versions", LOCAL)
    def versions_cmd(device: str = DeviceOpt) -> None:
        """Every version published for a device, newest first: hash, time, who, why (`show --version N`
        prints one, `rollback --to N` goes back to one)."""
        from enforcer import service

        def run() -> list[dict[str, Any]]:
            with open_context() as ctx, ctx.db.read_session() as session:
                return service.versions(session, device)
        emit(guard(run), VERSIONS)

    @command(enforcer, "status", API)
    def status_cmd(server: str = ServerOpt, cacert: Path = CaOpt) -> None:
        """Every device: desired vs applied version, pin, pending plan, drift, last apply (as `device list`), and
        what a device over its budget withholds, per tenant over its fair share."""
        from cli.remote.common import client
        from cli.remote.fabric import DEVICES

        emit(client(server, cacert).get("/v1/devices"),
             View(DEVICES.title, (*DEVICES.columns, Col("withheld (over budget)",
                                                         lambda d: _withheld(d.get("withheld")), drop=1))))
