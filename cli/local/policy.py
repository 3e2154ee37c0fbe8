"""`trustfabric policy validate|test|eval|upload|impact|activate|rollback|list|show|explain|flows|decisions|decision`.

validate and test work on a directory alone (offline); eval on files, or on a stored version; the others
open the local data directory (run them on the server host). Exit codes (cli.output's EXIT_*): 0 ok / yes
(validates, tests pass, ALLOW), 1 failure / no (problems found, tests fail or none to run, DENY, a version stored
whose tests fail, any error), 2 usage (a bad argument; an --input, --data or --signature-file that cannot be
read as what it says, before any work). `eval` prints the query's value, as
`opa eval` does, and exits 0 when it is undefined too. There is no `policy fmt`: no Rego formatter exists for
Python or regorus (`opa fmt` formats where OPA is installed).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from cli.output import (
    EXIT_USAGE,
    LOCAL,
    OFFLINE,
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
    local_settings,
    machine_output,
    open_context,
    read_local,
)
from cli.params import (
    IDENTITY,
    POLICY_REF,
    PORT_MAYBE_PROTO,
    PROTO,
    QUERY,
    SLUG,
    WHEN,
    choice,
    existing_dir,
    existing_file,
    one_protocol,
)

if TYPE_CHECKING:
    from store.readonly import ReadOnlyDb
    from workflows.context import AppContext

VERSIONS = View("policy versions", (
    Col("#", "number", kind="id"), Col("state", "state"), Col("hash", lambda r: r["content_hash"][:16], kind="id"),
    Col("tests", lambda r: "pass" if r["tests_passed"] else
        f"{len(r['tests_failing'])} failing" if r["tests_total"] else "no tests"),
    Col("uploaded by", "uploaded_by", drop=1), Col("created", "created_at", kind="time"), Col("note", "note", drop=2),
))
DECISIONS = View("policy decisions", (
    Col("id", "id", kind="id"), Col("time", "ts", kind="time"), Col("kind", "kind"), Col("tenant", "tenant"),
    Col("outcome", "outcome"), Col("policy", lambda r: (r["policy_hash"] or "")[:16], drop=2),
    Col("reasons", "reasons", drop=1),
))
TESTS = View("Rego tests", (
    Col("test", "name"), Col("result", lambda r: "pass" if r["passed"] else "FAIL"),
    Col("ms", lambda r: f"{r['duration_ms']:.2f}"), Col("error", "error"),
))
COVERAGE = View("coverage", (Col("module", "file"), Col("lines covered", lambda c: f"{c['percent']:.1f}%"),
                             Col("not covered", "not_covered")))

Directory = typer.Argument(..., help="a folder of .rego modules (recursively)", **existing_dir())


def _if_unchanged(note: str, flow: dict[str, Any]) -> str:
    """`note` for an impact report's policy flow whose wire state does not change (RoCEv2's mirror), else ''."""
    return note if flow.get("wire_unchanged") else ""


def _signature(signature: str | None, signature_file: Path | None) -> str | None:
    """--signature, or the text of --signature-file; both, or a file that cannot be read as text, is usage (exit 2)."""
    if signature is not None and signature_file is not None:
        fail("give --signature or --signature-file, not both", EXIT_USAGE)
    if signature_file is not None:
        try:
            return signature_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"--signature-file {signature_file}: cannot read it as base64 text ({exc})", EXIT_USAGE)
    return signature


def _version_dict(v: Any) -> dict[str, Any]:
    from policy.views import version_out

    return version_out(v).model_dump(mode="json")


def _compile_errors(directory: Path, exc: Any) -> NoReturn:
    """Every problem of a PolicyCompileError at DIRECTORY/file:line:col, then exit 1 (the policy is not valid)."""
    issues = [{"file": str(directory / i.file), "line": i.line, "col": i.col, "message": i.message}
              for i in exc.issues]
    if machine_output():
        emit({"ok": False, "errors": issues})
    else:
        for i in issues:
            err_console.print(f"{i['file']}:{i['line']}:{i['col']}: {i['message']}", highlight=False,
                              markup=False, soft_wrap=True)
    fail(f"{len(issues)} problem(s) in {directory}")


def _load_json_or_yaml(path: Path) -> Any:
    """A JSON or YAML document; InvalidInput naming the file when it cannot be read or is neither."""
    import json

    from core.errors import InvalidInput

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot read it as text ({exc})") from None
    try:
        return json.loads(text)
    except ValueError:
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidInput(f"{path} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None


def register(app: typer.Typer) -> None:
    policy = add_group(app, "policy", "Rego policies: validate, test, eval; upload, list, show, impact, activate, "
                       "rollback; explain, flows, decisions, decision.\n\n"
                       "No `policy fmt`: no Rego formatter exists for Python or regorus (`opa fmt` formats where OPA "
                       "is installed).", None)

    @command(policy, "validate", OFFLINE)
    def validate_cmd(directory: Path = Directory) -> None:
        """Compile and check every .rego under DIRECTORY as `opa check` does; each problem at file:line:col.

        Syntax, unsafe variables, undefined functions and references, arity, type errors on constants."""
        from policy import authoring
        from policy.errors import PolicyCompileError
        from policy.versions import load_dir

        modules = guard(lambda: load_dir(directory))
        try:
            digest = authoring.validate(modules)
        except PolicyCompileError as exc:
            _compile_errors(directory, exc)
        if machine_output():
            emit({"ok": True, "content_hash": digest, "modules": sorted(modules)})
        else:
            console.print(f"ok: {len(modules)} modules compile and check clean, content hash {digest}",
                          highlight=False)

    @command(policy, "test", OFFLINE)
    def test_cmd(
        directory: Path = Directory,
        run: str = typer.Option(None, "--run", "-r", metavar="REGEX",
                                help="only tests whose name (package.rule) this regular expression finds"),
        coverage: bool = typer.Option(False, "--coverage", help="per-module line coverage of the tests"),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="list every test, not only failures"),
    ) -> None:
        """Run the test_* rules under DIRECTORY; prints `PASS: n/n` or `FAIL: k/n` with the failures (exit 1, as when
        there is no test to run; 2 for a --run that is no regular expression)."""
        import re

        from policy import authoring
        from policy.errors import PolicyCompileError
        from policy.versions import load_dir

        if run is not None:
            try:
                re.compile(run)
            except re.error as exc:
                fail(f"--run {run!r} is not a regular expression: {exc}", EXIT_USAGE)
        modules = guard(lambda: load_dir(directory))
        try:
            report = authoring.test(modules, run=run, coverage=coverage)
        except PolicyCompileError as exc:
            _compile_errors(directory, exc)
        out = report.to_dict()
        if not report.results:
            fail(f"no test matches --run {run!r}" if run else f"no test_* rules in {directory}")
        if machine_output():
            emit({**out, "summary": report.summary})
        else:
            shown = out["results"] if verbose else [r for r in out["results"] if not r["passed"]]
            if shown:
                TESTS.table(shown)
            if coverage and report.coverage is not None:
                COVERAGE.table(out["coverage"]["files"])
                console.print(f"coverage: {report.coverage_percent:.1f}% of the lines of "
                              f"{len(report.coverage)} module(s)", highlight=False)
            console.print(report.summary, highlight=False)
        if not report.passed:
            fail(f"{len(report.failing)} of {len(report.results)} tests failed: {', '.join(report.failing)}")

    @command(policy, "eval", LOCAL)
    def eval_cmd(
        query: str = typer.Argument(..., parser=QUERY, metavar=QUERY.metavar,
                                    help="a Rego query, e.g. data.flows.decision"),
        input_file: Path = typer.Option(None, "--input", "-i", help="the input document (JSON or YAML)",
                                        **existing_file()),
        data: list[Path] = typer.Option([], "--data", "-d", exists=True, readable=True,
                                        help="a .rego module, a JSON/YAML data file, or a folder of both "
                                             "(repeatable); with only data files, the active version's modules"),
        version: str = typer.Option(None, "--version", parser=POLICY_REF, metavar=POLICY_REF.metavar,
                                    help="evaluate a stored version (local data directory), with the live data"),
    ) -> None:
        """Evaluate QUERY like `opa eval`, on --data files or a stored version.

        Against modules given with --data (offline), or against a stored version (--version; the active one
        when no module is given) with the live data document."""
        from core.errors import InvalidInput
        from policy import authoring
        from policy.versions import load_dir

        def collect() -> tuple[dict[str, str], dict[str, Any]]:
            modules: dict[str, str] = {}
            doc: dict[str, Any] = {}
            for path in data:
                if path.is_dir():
                    modules.update({f"{path.name}/{k}": v for k, v in load_dir(path).items()})
                    for extra in sorted([*path.rglob("*.json"), *path.rglob("*.yaml")]):
                        _merge(doc, _load_json_or_yaml(extra), extra)
                elif path.suffix == ".rego":
                    try:
                        modules[path.name] = path.read_text(encoding="utf-8")
                    except (OSError, UnicodeDecodeError) as exc:
                        raise InvalidInput(f"{path}: cannot read it as text ({exc})") from None
                else:
                    _merge(doc, _load_json_or_yaml(path), path)
            return modules, doc

        def read() -> tuple[dict[str, str], dict[str, Any], Any]:
            modules, doc = collect()
            return modules, doc, _load_json_or_yaml(input_file) if input_file is not None else None

        # the files given (--data, --input), read before any work: one that cannot be used is usage (exit 2)
        given_modules, given_doc, given_input = guard(read, EXIT_USAGE)

        def run() -> dict[str, Any]:
            modules, doc = given_modules, given_doc
            if version is None and modules:  # the operator's own files only: offline, in this process
                return authoring.evaluate_query(modules, query, input=given_input, data=doc)
            from policy import service
            from policy.data import build_data
            from workflows import policy as flows

            with open_context() as ctx:
                with ctx.db.read_session() as session:
                    v = service.get_version(session, version) if version else service.active_version(session)
                    if v is None:
                        from core.errors import NotFound

                        raise NotFound("no policy version is active: give --version or .rego files with --data")
                    modules = {**dict(v.modules), **modules}
                    doc = {**build_data(session, ctx.clock()), **doc}
                # stored Rego runs where the server runs it: in the policy sandbox, within its limits
                return flows.evaluate(ctx.settings, modules, query, input=given_input, data=doc)

        out = guard(run)
        if machine_output():
            emit(out)
            return
        import json

        results = out["result"]
        if not results:
            console.print("undefined", highlight=False)
            return
        for result in results:
            values = [e.get("value") for e in result.get("expressions", [])]
            bindings = result.get("bindings") or {}
            if bindings:
                console.print("  ".join(f"{k} = {json.dumps(v)}" for k, v in bindings.items()), highlight=False,
                              markup=False)
            for value in values:
                if not bindings or value is not True:
                    print(json.dumps(value, indent=2, sort_keys=True))

    @command(policy, "upload", LOCAL)
    def upload_cmd(directory: Path = Directory,
                   note: str = typer.Option("", "--note", help="why this version")) -> None:
        """Store DIRECTORY as a candidate version; exit 1 when its Rego tests fail.

        Nothing is stored when it does not compile or check clean; with failing tests it is stored but cannot
        be activated."""
        from policy import service
        from policy.authoring import PreparedVersion
        from policy.errors import PolicyCompileError
        from policy.versions import load_dir
        from workflows import policy as flows

        modules = guard(lambda: load_dir(directory))

        def prepare() -> PreparedVersion:  # compiled and tested in the policy sandbox, as the API does it
            try:
                return flows.prepare(local_settings(), modules)
            except PolicyCompileError as exc:
                _compile_errors(directory, exc)
        prepared = guard(prepare)

        def run() -> tuple[dict[str, Any], bool]:
            with open_context() as ctx, ctx.db.session() as session:
                v, created = service.upload(session, prepared, local_operator("security"), now=ctx.clock(), note=note)
                return _version_dict(v), created
        out, created = guard(run)
        if machine_output():
            emit({**out, "created": created})
        else:
            state = "uploaded" if created else "already stored"
            tests = ("tests pass" if out["tests_passed"] else "NO TESTS" if not out["tests_total"] else
                     f"TESTS FAIL: {', '.join(out['tests_failing'])}")
            console.print(f"version {out['number']} {state} ({out['content_hash'][:16]}), {tests}", highlight=False)
        if not out["tests_passed"] and not out["tests_total"]:  # passing needs at least one test (README)
            fail(f"version {out['number']} is stored but cannot be activated: it carries no Rego tests (a version "
                 f"needs at least one test_* rule, every one passing; add them and upload again)")
        if not out["tests_passed"]:
            fail(f"version {out['number']} is stored but cannot be activated: {len(out['tests_failing'])} of "
                 f"{out['tests_total']} Rego tests fail (fix them and upload again; `trustfabric policy test "
                 f"{directory}` shows why)")

    @command(policy, "list", LOCAL)
    def list_cmd() -> None:
        """Every version and its state."""
        def fast(db: ReadOnlyDb) -> list[dict[str, Any]]:
            from policy import reads

            return [_version_dict(v) for v in reads.list_versions(db)]

        def full(ctx: AppContext) -> list[dict[str, Any]]:
            from policy import service

            with ctx.db.read_session() as session:
                return [_version_dict(v) for v in service.list_versions(session)]
        emit(guard(lambda: read_local(fast, full)), VERSIONS)

    @command(policy, "show", LOCAL)
    def show_cmd(version: str = typer.Argument(None, parser=POLICY_REF, metavar="[N|HASH]",
                                                help="number or hash prefix; the active one by default"),
                 sources: bool = typer.Option(False, "--sources", help="print the modules' Rego text too")) -> None:
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
        if machine_output():
            emit(out)
            return
        keys = ("number", "state", "content_hash", "tests_passed", "tests_total", "tests_failing", "modules",
                "uploaded_by", "created_at", "activated_at", "signed_by", "note")
        emit({k: out[k] for k in keys})
        if sources:
            for name, text in sorted(out["sources"].items()):
                print(f"\n# ---- {name}\n{text}", end="" if text.endswith("\n") else "\n")

    @command(policy, "impact", LOCAL)
    def impact_cmd(version: str = typer.Argument(..., parser=POLICY_REF, metavar=POLICY_REF.metavar),
                   limit: int = typer.Option(50, "--limit", min=0, max=100_000, help="flows listed per side")) -> None:
        """Flows VERSION would open and close against the active version, on the current inventory; with a
        fabric, the devices whose rule sets it would change; and any flow on which its decision (what explain
        shows) and its allowed_flows (what the devices enforce) disagree, which activation refuses (all in the
        policy sandbox)."""
        from workflows.enforcement import impact

        def run() -> dict[str, Any]:
            with open_context() as ctx:
                return impact(ctx, version, limit=limit)
        out = guard(run)
        if machine_output():
            emit(out)
            return
        console.print(f"opened {out['opened_count']}, closed {out['closed_count']}, unchanged {out['unchanged']} "
                      f"(candidate {out['candidate_hash'][:16]} vs active {(out['baseline_hash'] or 'none')[:16]})",
                      highlight=False)
        if out["mirrors_opened_count"] or out["mirrors_closed_count"]:
            console.print(f"RoCEv2 mirrors on the wire (not policy flows): opened {out['mirrors_opened_count']}, "
                          f"closed {out['mirrors_closed_count']} (udp/4791 is symmetric on the SuperNICs: allowing "
                          "A -> B lets B's RoCEv2 reach A)", highlight=False, markup=False, soft_wrap=True)
        src = Col("src", lambda f: f"{f['src_tenant']}/{f['src_group']}")
        dst = Col("dst", lambda f: f"{f['dst_tenant']}/{f['dst_group']}")
        flows = (src, dst, Col("proto", "proto"), Col("port", "port"))
        for side in ("opened", "closed"):
            if out[side]:
                # a policy flow whose reverse is allowed passes on the wire either way (RoCEv2): say so
                columns: tuple[Col, ...] = flows
                if any(f.get("wire_unchanged") for f in out[side]):
                    note = f"{'passed already' if side == 'opened' else 'still passes'}: RoCEv2 mirror of the reverse"
                    columns += (Col("on the wire", partial(_if_unchanged, note)),)
                View(f"flows {side}", columns).table(out[side])
            if out.get(f"mirrors_{side}"):
                View(f"RoCEv2 mirrors {side} (not policy flows)",
                     (src, dst, Col("proto", "proto"), Col("port", "port"),
                      Col("mirror of", lambda f: f"{f['dst_tenant']}/{f['dst_group']} -> "
                                                 f"{f['src_tenant']}/{f['src_group']}"))).table(out[f"mirrors_{side}"])
        if out.get("disagreements_count"):
            # the candidate's decision (explain) and its allowed_flows (the devices) differ: activation is refused
            err_console.print(f"{out['disagreements_count']} disagreement(s) between the candidate's decision and its "
                              "allowed_flows: activation is refused until they agree", highlight=False, markup=False,
                              soft_wrap=True)
            View("disagreements", (src, dst, Col("proto", "proto"), Col("port", "port"),
                                   Col("allowed_flows", "allowed_flows"), Col("decision", "decision"),
                                   Col("decision's reasons", lambda f: "; ".join(f["reasons"])))).table(
                out["disagreements"])
        if out["by_tenant"]:
            View("by tenant", (Col("tenant", "tenant", kind="id"), Col("opened", "opened"),
                               Col("closed", "closed"))).table(
                [{"tenant": t, **c} for t, c in out["by_tenant"].items()])
        devices = out.get("devices")
        if devices:
            console.print(f"devices: {devices['touched']} of {devices['devices']} would change", highlight=False)
            if devices["by_device"]:
                View("by device", (Col("device", "device", kind="id"), Col("rules +", "rules_added"),
                                   Col("rules -", "rules_removed"), Col("leaks +", "leaks_added"),
                                   Col("leaks -", "leaks_removed"))).table(devices["by_device"])

    def _switch(kind: str, version: str, signature: str | None, signature_file: Path | None,
                reason: str | None) -> None:
        from workflows import policy as flows

        sig = _signature(signature, signature_file)  # before any work

        def run() -> dict[str, Any]:
            with open_context() as ctx:
                v = flows.switch(ctx, "activate" if kind == "activate" else "rollback", version,
                                 local_operator("security"), signature=sig, reason=reason)
                return _version_dict(v)
        out = guard(run)
        if machine_output():
            emit(out)
        else:
            console.print(f"version {out['number']} ({out['content_hash'][:16]}) is active", highlight=False)

    Signature = typer.Option(None, "--signature", help="base64, over the content hash")
    SignatureFile = typer.Option(None, "--signature-file", **existing_file())

    @command(policy, "activate", LOCAL)
    def activate_cmd(version: str = typer.Argument(..., parser=POLICY_REF, metavar=POLICY_REF.metavar),
                     signature: str = Signature, signature_file: Path = SignatureFile,
                     reason: str = typer.Option(None, "--reason")) -> None:
        """Put VERSION in force: tests present and passing, a signature outside development mode (and whenever
        policy keys are configured), the two-person rule when on, decisions within their budget."""
        _switch("activate", version, signature, signature_file, reason)

    @command(policy, "rollback", LOCAL)
    def rollback_cmd(version: str = typer.Argument(..., parser=POLICY_REF, metavar=POLICY_REF.metavar),
                     signature: str = Signature, signature_file: Path = SignatureFile,
                     reason: str = typer.Option(None, "--reason")) -> None:
        """Go back to an earlier VERSION."""
        _switch("rollback", version, signature, signature_file, reason)

    @command(policy, "explain", LOCAL)
    def explain_cmd(src: str = typer.Option(..., "--src", parser=IDENTITY, metavar=IDENTITY.metavar,
                                            help="SPIFFE ID or TENANT/GROUP"),
                    dst: str = typer.Option(..., "--dst", parser=IDENTITY, metavar=IDENTITY.metavar,
                                            help="SPIFFE ID or TENANT/GROUP"),
                    port: Any = typer.Option(..., "--port", parser=PORT_MAYBE_PROTO,
                                             metavar=PORT_MAYBE_PROTO.metavar, help="e.g. 8443 or udp/4791"),
                    proto: str | None = typer.Option(None, "--proto", parser=PROTO, metavar=PROTO.metavar,
                                                     help="default: the one --port names, else tcp")) -> None:
        """The decision on one flow under the active version, and why: exit 0 ALLOW, 1 DENY (as `grant explain`)."""
        from policy import service

        protocol, (number,) = one_protocol([port], proto)

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.read_session() as session:
                now = ctx.clock()
                d, digest = service.explain(session, src, dst, number, proto=protocol, now=now)
                notes = service.mirror_notes(session, src, dst, number, d, proto=protocol, now=now)
                return {**d.to_dict(), "notes": notes, "policy_hash": digest}
        out = guard(run)
        if machine_output():
            emit(out)
        else:
            # one line per reason whatever the width (soft_wrap: the terminal folds it, a pipe or a grep gets it whole)
            console.print(f"{'ALLOW' if out['allow'] else 'DENY'} {src} -> {dst} {protocol}/{number}",
                          highlight=False, markup=False, soft_wrap=True)
            for reason in out["reasons"]:
                console.print(f"  {reason}", highlight=False, markup=False, soft_wrap=True)
            for note in out["notes"]:  # what the devices add (RoCEv2's mirror); the verdict above is the policy's
                console.print(f"  note: {note}", highlight=False, markup=False, soft_wrap=True)
        if not out["allow"]:
            answer_no()

    @command(policy, "flows", LOCAL)
    def flows_cmd(src_tenant: str = typer.Option(..., "--src-tenant", parser=SLUG, metavar="TENANT"),
                  dst_tenant: str = typer.Option(..., "--dst-tenant", parser=SLUG, metavar="TENANT"),
                  offset: int = typer.Option(0, "--offset", min=0, max=1_000_000),
                  limit: int = typer.Option(200, "--limit", min=1, max=1000)) -> None:
        """The allowed flows from one tenant to another under the active version, with their reasons (a cell of
        the console's flow matrix); beside them, the RoCEv2 that passes only as the mirror of an allowed reverse."""
        from policy.flowset import FlowSets
        from policy.matrix import pair_listing

        def run() -> dict[str, Any]:
            with open_context() as ctx:
                sets = FlowSets(ctx.db, keep=False)
                try:
                    found = sets.current(ctx.clock())
                finally:
                    sets.close()
                listing = pair_listing(found.raw, src_tenant, dst_tenant, offset=offset, limit=limit)
                return {"policy_hash": found.policy_hash, "computed_at": found.computed_at, **listing}
        out = guard(run)
        if machine_output():
            emit(out)
            return
        console.print(f"{out['total']} flow{'' if out['total'] == 1 else 's'} from {src_tenant} to {dst_tenant} "
                      f"(policy {(out['policy_hash'] or 'none')[:16]})", highlight=False, markup=False)
        groups = (Col("src", "src_group"), Col("dst", "dst_group"), Col("proto", "proto"), Col("port", "port"))
        if out["items"]:
            View("flows", (*groups, Col("reasons", lambda f: ", ".join(f["reasons"])))).table(out["items"])
        if out["mirrors"]:
            console.print(f"RoCEv2 mirrors on the wire (not policy flows): {out['mirrors_total']} (udp/4791 is "
                          "symmetric on the SuperNICs: allowing A -> B lets B's RoCEv2 reach A)", highlight=False,
                          markup=False, soft_wrap=True)
            View("RoCEv2 mirrors (not policy flows)",
                 (*groups, Col("mirror of", lambda f: f"{f['dst_tenant']}/{f['dst_group']} -> "
                                                      f"{f['src_tenant']}/{f['src_group']}"))).table(out["mirrors"])
        if out["next_offset"] is not None:
            console.print(f"more: --offset {out['next_offset']}", highlight=False, markup=False)

    @command(policy, "decisions", LOCAL)
    def decisions_cmd(since: Any = typer.Option(None, "--since", parser=WHEN, metavar="TIME",
                                                help="ISO 8601 with timezone, or a time ago (1h, 7d); inclusive"),
                      until: Any = typer.Option(None, "--until", parser=WHEN, metavar="TIME",
                                                help="ISO 8601 with timezone, or a time ago (1h, 7d); exclusive"),
                      tenant: str = typer.Option(None, "--tenant", parser=SLUG, metavar="TENANT",
                                                 help="only this tenant's decisions"),
                      kind: str = typer.Option(None, "--kind", parser=choice("flow", "grant", "authz"),
                                               metavar="flow|grant|authz"),
                      allowed: bool = typer.Option(None, "--allowed/--denied", help="only allowed / denied ones"),
                      limit: int = typer.Option(100, "--limit", min=1, max=10_000)) -> None:
        """Sampled decision records (input, result, reasons, policy hash), newest first."""
        from cli.audit_filters import check_window
        from policy.decisionlog import format_ts, query_decisions
        from policy.views import decision_out

        check_window(since, until)

        def run() -> list[dict[str, Any]]:
            with open_context() as ctx, ctx.db.read_session() as session:
                rows = query_decisions(session, kind=kind, tenant=tenant, allowed=allowed, since=since, until=until,
                                       limit=limit)
                return [{**decision_out(r).model_dump(mode="json"), "ts": format_ts(r.ts)} for r in rows]
        emit(guard(run), DECISIONS)

    @command(policy, "decision", LOCAL)
    def decision_cmd(record_id: int = typer.Argument(..., min=1, metavar="ID")) -> None:
        """One sampled decision record: input, result, reasons, policy hash."""
        from policy.decisionlog import format_ts, get_decision
        from policy.views import decision_out

        def run() -> dict[str, Any]:
            with open_context() as ctx, ctx.db.read_session() as session:
                r = get_decision(session, record_id)
                return {**decision_out(r).model_dump(mode="json"), "ts": format_ts(r.ts)}
        emit(guard(run), DECISIONS)


def _merge(doc: dict[str, Any], value: Any, source: Path) -> None:
    from core.errors import InvalidInput

    if not isinstance(value, dict):
        raise InvalidInput(f"--data {source}: a data file must hold an object")
    doc.update(value)
