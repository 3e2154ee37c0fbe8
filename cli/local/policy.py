"""`trustfabric policy validate|test|upload|impact|activate|rollback|list|show|explain|decisions`.

validate and test work on a directory alone; the others open the local data directory (run them on the
server host). Exit 0 ok, 1 failure (one readable line), 2 usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import (
    JsonOpt,
    console,
    emit_json,
    emit_table,
    fail,
    guard,
    local_operator,
    open_context,
)


def _signature(signature: str | None, signature_file: Path | None) -> str | None:
    if signature_file is not None:
        return signature_file.read_text(encoding="ascii").strip()
    return signature


def _version_dict(v: Any) -> dict[str, Any]:
    from policy.views import version_out

    return version_out(v).model_dump(mode="json")


def register(app: typer.Typer) -> None:
    policy = typer.Typer(help="Rego policy versions: validate, test, upload, impact, activate, rollback.",
                         no_args_is_help=True)
    app.add_typer(policy, name="policy")

    @policy.command("validate")
    def validate_cmd(directory: Path, json_out: bool = JsonOpt) -> None:
        """Compile every .rego under DIRECTORY; errors carry file:line:col."""
        from policy.versions import load_dir
        from workflows import policy as flows
        from workflows.settings import Settings

        def run() -> tuple[str, list[str]]:
            modules = load_dir(directory)
            return flows.validate(Settings.from_env(), modules), sorted(modules)
        digest, names = guard(run)
        if json_out:
            emit_json({"content_hash": digest, "modules": names})
        else:
            console.print(f"ok: {len(names)} modules compile, content hash {digest}", highlight=False)

    @policy.command("test")
    def test_cmd(directory: Path, json_out: bool = JsonOpt) -> None:
        """Run every test_* rule under DIRECTORY; exit 1 naming the failing tests."""
        from policy.versions import load_dir
        from workflows import policy as flows
        from workflows.settings import Settings

        report = guard(lambda: flows.test(Settings.from_env(), load_dir(directory)))
        if json_out:
            emit_json(report.to_dict())
        else:
            emit_table("Rego tests", ("test", "result", "ms", "error"),
                       [(r.name, "pass" if r.passed else "FAIL", f"{r.duration_ms:.2f}", r.error or "")
                        for r in report.results])
        if not report.passed:
            fail(f"{len(report.failing)} of {len(report.results)} tests failed: {', '.join(report.failing)}", 1)

    @policy.command("upload")
    def upload_cmd(directory: Path, note: str = typer.Option("", "--note", help="why this version"),
                   json_out: bool = JsonOpt) -> None:
        """Upload DIRECTORY as a candidate version (compiled, tests run; nothing stored on a compile error)."""
        from policy import service
        from policy.versions import load_dir
        from workflows import policy as flows

        def run() -> tuple[dict[str, Any], bool]:
            with open_context() as ctx:
                prepared = flows.prepare(ctx.settings, load_dir(directory))
            with open_context() as ctx, ctx.db.session() as session:
                v, created = service.upload(session, prepared, local_operator("security"), now=ctx.clock(), note=note)
                return _version_dict(v), created
        out, created = guard(run)
        if json_out:
            emit_json({**out, "created": created})
            return
        state = "uploaded" if created else "already stored"
        tests = "tests pass" if out["tests_passed"] else f"TESTS FAIL: {', '.join(out['tests_failing'])}"
        console.print(f"version {out['number']} {state} ({out['content_hash'][:16]}), {tests}", highlight=False)

    @policy.command("list")
    def list_cmd(json_out: bool = JsonOpt) -> None:
        """Every version and its state."""
        from policy import service

        def run() -> list[dict[str, Any]]:
            with open_context() as ctx, ctx.db.read_session() as session:
                return [_version_dict(v) for v in service.list_versions(session)]
        rows = guard(run)
        if json_out:
            emit_json(rows)
            return
        emit_table("policy versions", ("#", "state", "hash", "tests", "uploaded by", "created", "note"),
                   [(r["number"], r["state"], r["content_hash"][:16],
                     "pass" if r["tests_passed"] else f"{len(r['tests_failing'])} failing",
                     r["uploaded_by"], r["created_at"], r["note"]) for r in rows])

    @policy.command("show")
    def show_cmd(version: str = typer.Argument(None, help="number or hash prefix; the active one by default"),
                 json_out: bool = JsonOpt) -> None:
        """One version: state, modules, test results."""
        from policy import service
        from policy.views import version_out

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.read_session() as session:
                v = service.get_version(session, version) if version else service.active_version(session)
                if v is None:
                    from core.errors import NotFound

                    raise NotFound("no policy version is active")
                return version_out(v, detail=True).model_dump(mode="json")
        out = guard(run)
        if json_out:
            emit_json(out)
            return
        for key in ("number", "state", "content_hash", "tests_passed", "tests_total", "tests_failing", "modules",
                    "uploaded_by", "created_at", "activated_at", "signed_by", "note"):
            console.print(f"{key}: {out[key]}", highlight=False)

    @policy.command("impact")
    def impact_cmd(version: str, limit: int = typer.Option(50, "--limit", min=0, help="flows listed per side"),
                   json_out: bool = JsonOpt) -> None:
        """Flows VERSION would open and close against the active version, on the current inventory."""
        from workflows import policy as flows

        def run() -> dict[str, Any]:
            with open_context() as ctx:
                return flows.impact(ctx, version).to_dict(limit=limit)
        out = guard(run)
        if json_out:
            emit_json(out)
            return
        console.print(f"opened {out['opened_count']}, closed {out['closed_count']}, unchanged {out['unchanged']} "
                      f"(candidate {out['candidate_hash'][:16]} vs active {str(out['baseline_hash'])[:16]})",
                      highlight=False)
        for side in ("opened", "closed"):
            if out[side]:
                emit_table(f"flows {side}", ("src", "dst", "proto", "port"),
                           [(f"{f['src_tenant']}/{f['src_group']}", f"{f['dst_tenant']}/{f['dst_group']}",
                             f["proto"], f["port"]) for f in out[side]])
        if out["by_tenant"]:
            emit_table("by tenant", ("tenant", "opened", "closed"),
                       [(t, c["opened"], c["closed"]) for t, c in out["by_tenant"].items()])

    def _switch(kind: str, version: str, signature: str | None, signature_file: Path | None,
                reason: str | None, json_out: bool) -> None:
        from workflows import policy as flows

        def run() -> dict[str, Any]:
            sig = _signature(signature, signature_file)
            with open_context() as ctx:
                v = flows.switch(ctx, "activate" if kind == "activate" else "rollback", version,
                                 local_operator("security"), signature=sig, reason=reason)
                return _version_dict(v)
        out = guard(run)
        if json_out:
            emit_json(out)
        else:
            console.print(f"version {out['number']} ({out['content_hash'][:16]}) is active", highlight=False)

    @policy.command("activate")
    def activate_cmd(version: str, signature: str = typer.Option(None, "--signature", help="base64"),
                     signature_file: Path = typer.Option(None, "--signature-file"),
                     reason: str = typer.Option(None, "--reason"), json_out: bool = JsonOpt) -> None:
        """Put VERSION in force (tests must pass; a signature when policy keys are configured)."""
        _switch("activate", version, signature, signature_file, reason, json_out)

    @policy.command("rollback")
    def rollback_cmd(version: str, signature: str = typer.Option(None, "--signature", help="base64"),
                     signature_file: Path = typer.Option(None, "--signature-file"),
                     reason: str = typer.Option(None, "--reason"), json_out: bool = JsonOpt) -> None:
        """Go back to an earlier VERSION."""
        _switch("rollback", version, signature, signature_file, reason, json_out)

    @policy.command("explain")
    def explain_cmd(src: str = typer.Option(..., "--src", help="SPIFFE ID or tenant/group"),
                    dst: str = typer.Option(..., "--dst", help="SPIFFE ID or tenant/group"),
                    port: int = typer.Option(..., "--port", min=1, max=65535),
                    proto: str = typer.Option("tcp", "--proto"), json_out: bool = JsonOpt) -> None:
        """The decision on one flow under the active version, and why. Exit 0 whatever the decision."""
        from policy import service

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.read_session() as session:
                d, digest = service.explain(session, src, dst, port, proto=proto, now=ctx.clock())
                return {**d.to_dict(), "policy_hash": digest}
        out = guard(run)
        if json_out:
            emit_json(out)
            return
        console.print(f"{'ALLOW' if out['allow'] else 'DENY'} {src} -> {dst} {proto}/{port}", highlight=False)
        for reason in out["reasons"]:
            console.print(f"  {reason}", highlight=False)

    @policy.command("decisions")
    def decisions_cmd(since: str = typer.Option(None, "--since", help="ISO 8601 with timezone, inclusive"),
                      until: str = typer.Option(None, "--until", help="ISO 8601 with timezone, exclusive"),
                      tenant: str = typer.Option(None, "--tenant", help="only this tenant's decisions"),
                      kind: str = typer.Option(None, "--kind", help="flow | grant | authz"),
                      allowed: bool = typer.Option(None, "--allowed/--denied", help="only allowed / denied ones"),
                      limit: int = typer.Option(100, "--limit", min=1, max=10_000),
                      json_out: bool = JsonOpt) -> None:
        """Sampled decision records (input, result, reasons, policy hash), newest first."""
        from core.clock import parse_when
        from policy.decisionlog import KINDS, format_ts, query_decisions
        from policy.views import decision_out

        def run() -> list[dict[str, Any]]:
            if kind is not None and kind not in KINDS:
                from core.errors import InvalidInput

                raise InvalidInput(f"--kind must be one of {', '.join(KINDS)}")
            start = parse_when(since, "since") if since is not None else None
            end = parse_when(until, "until") if until is not None else None
            with open_context() as ctx, ctx.db.read_session() as session:
                rows = query_decisions(session, kind=kind, tenant=tenant, allowed=allowed, since=start, until=end,
                                       limit=limit)
                return [{**decision_out(r).model_dump(mode="json"), "ts": format_ts(r.ts)} for r in rows]
        rows = guard(run)
        if json_out:
            emit_json(rows)
            return
        emit_table("policy decisions", ("id", "ts", "kind", "tenant", "outcome", "policy", "reasons"),
                   [(r["id"], r["ts"], r["kind"], r["tenant"] or "", r["outcome"], (r["policy_hash"] or "")[:16],
                     "; ".join(r["reasons"])) for r in rows])
