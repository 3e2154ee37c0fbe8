"""One exit-code scheme for every command (cli.output's EXIT_*, the README's "Exit codes"), as grep and diff answer:
0 yes / done, 1 no (DENY, FAILED, failing tests, problems found, a denied request), 2 no answer (a bad argument or
input, an unreadable file, the server unreachable or refusing, any error), 3 `audit verify` unproven. Each verb that
answers yes or no is asked for each answer, against the real data directory and the served API; `policy explain`
exited 0 on DENY while `grant explain` exited 1, and `audit verify` with an unreadable key exited 1 as a FAILED
verification did. (`lab probe`, 0 OPEN and 1 BLOCKED, needs the lab: tests/lab/test_cli.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from cli.output import EXIT_ERROR, EXIT_NO, EXIT_OK, EXIT_UNPROVEN
from tests.cli.conftest import Cli, Run, run_cli
from tests.policy.conftest import free_port

CLI_DIR = Path(__file__).resolve().parents[2] / "cli"


@pytest.fixture(scope="module")
def world(cli: Cli) -> dict[str, str]:
    """acme/web and acme/db, globex/api (tcp/443); an admin's and acme's tenant-admin's tokens."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    for slug in ("acme", "globex"):
        assert cli.run("tenant", "create", slug, "--display-name", slug.title(), token=admin).returncode == 0
    for tenant, group in (("acme", "web"), ("acme", "db"), ("globex", "api")):
        r = cli.run("group", "create", tenant, group, "--port", "tcp/443", token=admin)
        assert r.returncode == 0, r.stderr
    return {"admin": admin, "acme": cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")}


def one_line(r: Run) -> bool:
    return r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_policy_explain_and_grant_explain_answer_alike(cli: Cli, world: dict[str, str]) -> None:
    explain = ("policy", "explain", "--src", "acme/web", "--port", "443")
    allow = cli.run(*explain, "--dst", "acme/db")
    assert allow.returncode == EXIT_OK and allow.stdout.startswith("ALLOW"), allow.stderr
    deny = cli.run(*explain, "--dst", "globex/api")
    assert deny.returncode == EXIT_NO and deny.stdout.startswith("DENY") and deny.stderr == "", deny.stderr
    as_json = cli.run(*explain, "--dst", "globex/api", "--json")
    assert as_json.returncode == EXIT_NO and json.loads(as_json.stdout)["allow"] is False
    bad = cli.run(*explain, "--dst", "not a group")
    assert bad.returncode == EXIT_ERROR and one_line(bad), bad.stderr
    usage = cli.run("policy", "explain", "--src", "acme/web", "--dst", "acme/db", "--port", "99999")
    assert usage.returncode == EXIT_ERROR and one_line(usage), usage.stderr
    missing = cli.run(*explain, "--dst", "acme/db", TRUSTFABRIC_HOME=str(cli.cwd / "nothing-here"))
    assert missing.returncode == EXIT_ERROR and one_line(missing), missing.stderr

    grant = ("grant", "explain", "--src-group", "web", "--port", "443", "--ttl", "1h")
    pending = cli.run(*grant, "--dst", "globex/api", "--src-tenant", "acme", token=world["admin"])
    assert pending.returncode == EXIT_OK and pending.stdout.startswith("would be pending"), pending.stdout
    denied = cli.run(*grant, "--dst", "acme/db", token=world["acme"])  # its own tenant: no grant needed
    assert denied.returncode == EXIT_NO and denied.stdout.startswith("would be denied"), denied.stdout
    refused = cli.run(*grant, "--dst", "globex/api", "--src-tenant", "globex", token=world["acme"])
    assert refused.returncode == EXIT_ERROR and one_line(refused) and "HTTP 403" in refused.stderr
    away = cli.run(*grant, "--dst", "globex/api", token=world["acme"], TRUSTFABRIC_SERVER=f"http://127.0.0.1:{free_port()}")
    assert away.returncode == EXIT_ERROR and one_line(away) and "cannot reach" in away.stderr, away.stderr
    request = cli.run("grant", "request", "--src-group", "web", "--dst", "acme/db", "--port", "443",
                      token=world["acme"])
    assert request.returncode == EXIT_NO and "denied" in request.stdout, request.stdout


def test_audit_verify_tells_failed_from_unreadable(cli: Cli, world: dict[str, str], tmp_path: Path) -> None:
    key = tmp_path / "audit.pem"
    key.write_text(cli.run("audit", "public-key").stdout)
    out = tmp_path / "all.jsonl"
    assert cli.run("audit", "export", "--out", str(out)).returncode == EXIT_OK
    ok = run_cli(["audit", "verify", str(out), "--public-key", str(key)], {})
    assert ok.returncode == EXIT_OK and ok.stdout.startswith("OK:"), ok.stderr
    lines = out.read_bytes().splitlines(keepends=True)
    altered = tmp_path / "altered.jsonl"
    altered.write_bytes(b"".join([*lines[:3], lines[3].replace(b'"action":"', b'"action":"x', 1), *lines[4:]]))
    failed = run_cli(["audit", "verify", str(altered), "--public-key", str(key)], {})
    assert failed.returncode == EXIT_NO and failed.stderr.startswith("error: FAILED ("), failed.stderr
    for not_a_key in (tmp_path / "README.md", out):  # text with two `+`, and the export itself
        if not_a_key.suffix == ".md":
            not_a_key.write_text("C++ and a+b\n")
        for extra in ((), ("--json",)):
            r = run_cli(["audit", "verify", str(out), "--public-key", str(not_a_key), *extra], {})
            assert r.returncode == EXIT_ERROR, (not_a_key, extra, r.stdout, r.stderr)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\x00\x01 not an export\n")
    r = run_cli(["audit", "verify", str(garbage), "--public-key", str(key)], {})
    assert r.returncode == EXIT_NO and "FAILED (malformed)" in r.stderr, r.stderr  # read, and not intact
    r = run_cli(["audit", "verify", str(tmp_path / "missing.jsonl"), "--public-key", str(key)], {})
    assert r.returncode == EXIT_ERROR and one_line(r), r.stderr
    narrowed = tmp_path / "actor.jsonl"
    assert cli.run("audit", "export", "--out", str(narrowed), "--actor-tenant", "acme").returncode == EXIT_OK
    r = run_cli(["audit", "verify", str(narrowed), "--public-key", str(key)], {})
    assert r.returncode == EXIT_UNPROVEN and r.stderr.startswith("UNPROVEN: "), r.stderr


def test_policy_validate_and_test(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "lib.rego").write_text("package lib\n\nimport rego.v1\n\ndouble(x) := 2 * x\n")
    (good / "lib_test.rego").write_text("package lib_test\n\nimport data.lib\nimport rego.v1\n\n"
                                        "test_double if lib.double(2) == 4\n")
    assert run_cli(["policy", "validate", str(good)], {}).returncode == EXIT_OK
    assert run_cli(["policy", "test", str(good)], {}).returncode == EXIT_OK
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "lib.rego").write_text("package lib\n\nimport rego.v1\n\ndouble(x) := 3 * x\n")
    (failing / "lib_test.rego").write_text((good / "lib_test.rego").read_text())
    assert run_cli(["policy", "test", str(failing)], {}).returncode == EXIT_NO
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.rego").write_text("package a\n\nimport rego.v1\n\nallow if undefined_fn(1)\n")
    for verb in ("validate", "test"):
        r = run_cli(["policy", verb, str(broken)], {})
        assert r.returncode == EXIT_NO and r.stderr.splitlines()[-1].startswith("error: 1 problem"), (verb, r.stderr)
    no_tests = run_cli(["policy", "test", str(broken.parent / "good"), "--run", "nothing-matches"], {})
    assert no_tests.returncode == EXIT_ERROR and one_line(no_tests), no_tests.stderr
    missing = run_cli(["policy", "validate", str(tmp_path / "missing")], {})
    assert missing.returncode == EXIT_ERROR and one_line(missing), missing.stderr


def test_status_tells_a_refused_token_from_an_unreachable_server(cli: Cli, world: dict[str, str]) -> None:
    signed_in = cli.run("status", token=world["acme"])
    assert signed_in.returncode == EXIT_OK, signed_in.stderr
    refused = cli.run("status", token="not-a-token-" + "x" * 40)
    assert refused.returncode == EXIT_NO and "HTTP 401" in refused.stdout, refused.stdout
    away = cli.run("status", token=world["acme"], TRUSTFABRIC_SERVER=f"http://127.0.0.1:{free_port()}")
    assert away.returncode == EXIT_ERROR and "cannot reach" in away.stdout, away.stdout


def test_an_error_of_any_command_is_no_answer(cli: Cli, world: dict[str, str]) -> None:
    for argv in (("tenant", "show", "nosuch"), ("grant", "show", "g-ffffffff"), ("group", "create", "acme", "web")):
        r = cli.run(*argv, token=world["admin"])
        assert r.returncode == EXIT_ERROR and one_line(r), (argv, r.stderr)
    r = cli.run("tenant", "list")  # no token
    assert r.returncode == EXIT_ERROR and one_line(r), r.stderr


def _literal_exits(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that end a command with a code written as a number: typer.Exit(n), sys.exit(n), fail(..., n)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args: list[Any] = list(node.args)
        if name == "fail":
            args = args[1:] + [k.value for k in node.keywords if k.arg == "code"]
        elif name not in ("Exit", "exit"):
            continue
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and arg.value not in (0, EXIT_ERROR):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_command_exits_with_a_number_of_its_own() -> None:
    """Every exit other than 0 (done) and 2 (usage, no answer) names its meaning (EXIT_NO, EXIT_UNPROVEN, ...),
    so a new command cannot bring back a 1 that means an error."""
    offenders = {str(path.relative_to(CLI_DIR)): hits for path in sorted(CLI_DIR.rglob("*.py"))
                 if path.name != "output.py" and (hits := _literal_exits(ast.parse(path.read_text())))}
    assert offenders == {}, offenders
