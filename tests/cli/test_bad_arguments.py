"""Every command, every option and argument that can be wrong: fed a bad value (with good ones for the rest),
the command ends with exit 2 and one line naming the option, before any work -- no data directory made, no
server asked (both would end differently: exit 1, "does not exist" or "cannot reach"). The commands are
enumerated from the CLI itself, so a new option cannot escape; a free-text option must be named below."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from cli.main import app
from cli.params import Check
from tests.cli.conftest import run_cli

# Options whose value is free text: any string is a valid value (the server bounds their length).
FREE_TEXT = {
    "display_name", "prefix", "justification", "idempotency_key", "reason", "comment", "subject", "description",
    "note", "host", "audience", "serial", "signature", "query", "src", "dst", "action", "token", "version",
    "run", "profile", "gid", "tid", "token_id", "actor",
}


@cache
def leaf_commands() -> tuple[tuple[list[str], Any], ...]:
    """Every leaf command of the CLI with its path; built once per process (typer builds the whole click tree
    on each call, ~0.07 s, and this module looks a command up in each of its ~500 cases)."""

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    return tuple(walk(typer.main.get_command(app), []))


def _info(param: Any) -> Any:
    return param.type_descriptor.parameter_info


def _is_path(param: Any) -> bool:
    info = _info(param)
    return bool(info.exists or not info.file_okay or not info.dir_okay) or param.type_descriptor.annotation is Path


def good_value(param: Any, files: dict[str, Path]) -> str | None:
    """A value the parameter accepts (None for a flag)."""
    info = _info(param)
    if getattr(param, "is_flag", False):
        return None
    if isinstance(info.parser, Check):
        return info.parser.good
    if _is_path(param):
        return str(files["dir"] if not info.file_okay else files["file"])
    if info.min is not None:
        return str(info.min)
    if param.type_descriptor.annotation in (int, float):
        return "1"
    return "x"


def bad_value(param: Any, files: dict[str, Path]) -> str | None:
    """A value the parameter must refuse while parsing; None when any value is valid (free text, flags)."""
    info = _info(param)
    if getattr(param, "is_flag", False):
        return None
    if isinstance(info.parser, Check):
        return info.parser.bad
    if _is_path(param):
        if not info.dir_okay:
            return str(files["dir"])  # a folder where a file is expected
        if not info.file_okay:
            return str(files["file"])  # a file where a folder is expected
        if info.exists:
            return str(files["missing"])
        return None
    if info.max is not None:
        return str(info.max + 1)
    if info.min is not None and info.min >= 1:
        return str(info.min - 1)
    if param.type_descriptor.annotation in (int, float):
        return "abc"
    return None


def cases() -> Iterator[Any]:
    for path, cmd in leaf_commands():
        for param in cmd.params:
            if param.name in ("help",):
                continue
            yield pytest.param(path, param.name, id=f"{' '.join(path)}:{param.name}")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bad-args")
    (base / "a-file.txt").write_text("x\n")
    (base / "a-dir").mkdir()
    return {"file": base / "a-file.txt", "dir": base / "a-dir", "missing": base / "missing", "base": base}


def _args(cmd: Any, target: str, value: str, files: dict[str, Path]) -> list[str]:
    """Good values for every required parameter but `target`, which gets `value`; an argument's place is its
    position, so an optional argument before the target gets a good value too (`workload show acme train BAD`)."""
    args: list[str] = []
    positional: list[str] = []
    arguments = [p.name for p in cmd.params if p.param_type_name == "argument"]
    before = arguments[:arguments.index(target)] if target in arguments else []
    for param in cmd.params:
        is_target = param.name == target
        if not (param.required or is_target or param.name in before):
            continue
        given = value if is_target else good_value(param, files)
        if param.param_type_name == "argument":
            positional.append(given or "x")
        elif given is None:
            args.append(param.opts[0])
        else:
            args.extend([param.opts[0], given])
    return [*positional, *args]


@pytest.mark.parametrize(("path", "name"), list(cases()))
def test_a_bad_value_is_one_line_before_any_work(path: list[str], name: str, files: dict[str, Path]) -> None:
    cmd = next(c for p, c in leaf_commands() if p == path)
    param = next(p for p in cmd.params if p.name == name)
    bad = bad_value(param, files)
    if bad is None:
        free = getattr(param, "is_flag", False) or name in FREE_TEXT
        assert free, f"{' '.join(path)} {param.opts}: takes any value; check it (cli/params.py) or list it as free text"
        return
    home = files["base"] / f"home-{'-'.join(path)}-{name}"
    env = {"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_SERVER": "http://127.0.0.1:9",
           "TRUSTFABRIC_CONFIG": str(files["missing"]), "COLUMNS": "200"}
    r = run_cli([*path, *_args(cmd, name, bad, files)], env)
    shown = param.opts[0] if param.param_type_name == "option" else (param.metavar or name)
    assert r.returncode == 2, (path, name, bad, r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert shown in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not home.exists() and r.stdout == ""


def test_every_command_is_covered() -> None:
    commands = [" ".join(p) for p, _ in leaf_commands()]
    for expected in ("serve", "pdp", "login", "grant request", "tenant create", "policy validate", "audit verify",
                     "token list", "workload show", "audit events"):
        assert expected in commands


@pytest.mark.parametrize(("argv", "says"), [
    (["serve", "--port", "99999"], "'--port': '99999' is not a port number (1-65535)"),
    (["tenant", "list", "--server", "127.0.0.1:8443"], "is not an http:// or https:// URL (e.g. http://127.0.0.1:8443)"),
    (["policy", "validate", "FILE"], "is a file"),
    (["pdp", "--port", "0"], "is not a port number"),
    (["group", "create", "acme", "web", "--port", "tcp/70000"], "is not a port number"),
    # as grant request's --dst: an identity that cannot be one is the command line's (it was exit 1, after opening
    # the data directory)
    (["policy", "explain", "--src", "acme", "--dst", "globex/api", "--port", "8443"],
     "'--src': 'acme' is neither a SPIFFE ID nor <tenant>/<group>"),
    (["policy", "explain", "--src", "acme/web", "--dst", "spiffe://example.org/node/n1", "--port", "8443"],
     "'--dst': 'spiffe://example.org/node/n1' is not a trustfabric SPIFFE ID"),
    # as audit export's --action (it was exit 1: the server's 422, or `cannot reach` first)
    (["audit", "events", "--action", "approve"], "'--action': 'approve' is not an action like 'svid.issue'"),
    (["audit", "export", "--out", "FILE", "--action", "approve"], "'--action': 'approve' is not an action"),
    # as enforcer plan --staged's: a version that cannot be one (it was exit 1, after opening the data directory)
    (["policy", "activate", "abc"], "'N|HASH': 'abc' is neither a policy version number nor a content-hash prefix"),
    (["policy", "eval", "1", "--version", "v2"], "'--version': 'v2' is neither a policy version number"),
])
def test_the_issue_s_examples(argv: list[str], says: str, files: dict[str, Path]) -> None:
    argv = [str(files["file"]) if a == "FILE" else a for a in argv]
    r = run_cli(argv, {"TRUSTFABRIC_HOME": str(files["missing"]), "TRUSTFABRIC_CONFIG": str(files["missing"])})
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
