"""`--help` says where every command runs; `--version`; shell completion."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cli.output import MIXED_PANEL, PANELS
from tests.cli.conftest import run_cli
from tests.cli.test_bad_arguments import leaf_commands

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_sits_in_the_panel_for_where_it_runs() -> None:
    panels = set(PANELS.values())
    for path, cmd in leaf_commands():
        assert cmd.rich_help_panel in panels, (path, cmd.rich_help_panel)
    r = run_cli(["policy", "--help"], {"COLUMNS": "120"})
    assert r.returncode == 0
    for panel in (PANELS["offline"], PANELS["local"]):
        assert panel in r.stdout
    assert "No `policy fmt`" in r.stdout


def test_panel_titles_fit_an_80_column_terminal() -> None:
    """rich cuts a panel's title that is wider than its box (`... node SVID over mT─╮`): at 80 columns, the
    default of a terminal and of a pipe, every panel the root --help shows must keep its whole title."""
    known = {*PANELS.values(), MIXED_PANEL, "Options", "Arguments", "Commands"}
    groups = sorted({tuple(path[:-1]) for path, _ in leaf_commands()})
    seen = set()
    for group in groups:
        r = run_cli([*group, "--help"], {"COLUMNS": "80"})
        assert r.returncode == 0
        for line in r.stdout.splitlines():
            if line.startswith("╭─"):
                whole = re.fullmatch(r"╭─ (.+?) ─+╮", line)
                assert whole is not None and whole.group(1) in known, (group, line)
                seen.add(whole.group(1))
    assert seen >= {*PANELS.values(), MIXED_PANEL}


def test_version_is_the_package_s() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    r = run_cli(["--version"], {})
    assert r.returncode == 0 and r.stdout.strip() == f"trustfabric {version}"


def test_shell_completion_script_and_answers() -> None:
    # typer finds the shell from the parent processes: run the binary under bash (two commands, so bash
    # does not exec it away), as a user's shell would, not under whatever started the test session
    binary = Path(sys.executable).parent / "trustfabric"
    r = subprocess.run(["bash", "-c", f'"{binary}" --show-completion; exit $?'], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0 and "_TRUSTFABRIC_COMPLETE" in r.stdout, r.stderr
    answers = run_cli([], {"_TRUSTFABRIC_COMPLETE": "complete_bash", "COMP_WORDS": "trustfabric pol",
                           "COMP_CWORD": "1"})
    assert "policy" in answers.stdout.split()


def test_no_arguments_prints_the_help() -> None:
    r = run_cli([], {})
    assert r.returncode == 0 and "Usage: trustfabric" in r.stdout
    r = run_cli(["grant"], {})
    assert r.returncode == 0 and "request" in r.stdout


def test_the_readme_lists_every_command_where_it_runs() -> None:
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The command line"):text.index("## Logs, metrics, traces")]
    rows = {"over the API": "api", "locally, on the server host": "local", "offline": "offline", "on a node": "node"}
    documented: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] in rows:
            for name in re.findall(r"`([a-z][a-z -]*?)`", cells[2]):
                documented[name] = rows[cells[0]]
    actual = {" ".join(path): next(k for k, v in PANELS.items() if v == cmd.rich_help_panel)
              for path, cmd in leaf_commands()}
    assert documented == actual


def test_help_paragraphs_wrap_at_the_terminal_not_at_the_source() -> None:
    # typer keeps a docstring's line breaks after its first paragraph: `serve --help` broke mid-sentence
    r = run_cli(["serve", "--help"], {"COLUMNS": "200"})
    assert r.returncode == 0
    assert "With several workers their metrics are summed" in r.stdout, r.stdout
    from cli.main import _command

    def paragraphs(command: Any, path: str) -> Iterator[tuple[str, str]]:
        for p in (command.help or "").partition("\f")[0].split("\n\n"):
            yield path, p
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from paragraphs(sub, f"{path} {name}")

    broken = [(path, p) for path, p in paragraphs(_command(), "trustfabric") if "\n" in p.strip("\n")]
    assert broken == []


def test_help_shows_no_python_type_names() -> None:
    """typer 0.29 labels types with Python's names: `--json <bool>` reads as a flag that wants a value, and
    `<str>`, `<list[Path]>`, `<int range>` are no words of a command line. A flag shows none; the rest show click's
    words (TEXT, INTEGER, FILE, PATH) or their own metavar."""
    from typer._click.core import Context

    from cli.main import _command

    def labels(command: Any, path: str) -> Iterator[tuple[str, str]]:
        ctx = Context(command)
        help_option = command.get_help_option(ctx)
        for param in [*command.params, *([help_option] if help_option is not None else [])]:
            label = param.display_type_rich(ctx=ctx)
            if label:
                yield f"{path} {param.opts[0] if param.opts else param.name}", label
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from labels(sub, f"{path} {name}")

    pythonic = [(where, label) for where, label in labels(_command(), "trustfabric")
                if label.startswith("<") or "list[" in label]
    assert pythonic == []
    for argv in (["svid", "jwt", "--help"], ["serve", "--help"], ["tenant", "show", "--help"]):
        r = run_cli(argv, {"COLUMNS": "200"})
        assert r.returncode == 0
        assert not re.search(r"<(bool|str|int|float|list)", r.stdout), r.stdout
        assert re.search(r"--help\s+Show this message", r.stdout), r.stdout  # a flag: no type between
    r = run_cli(["svid", "jwt", "--help"], {"COLUMNS": "200"})
    assert re.search(r"--audience\s+TEXT", r.stdout) and re.search(r"--json\s+Machine-readable", r.stdout), r.stdout


def test_a_group_s_summary_names_every_command_it_holds() -> None:
    """`trustfabric --help` lists each group as `Noun: verb, verb, ...`; several left verbs out (policy: list, show,
    explain, flows, decisions; enforcer: versions; token: recover; audit: show; ca: keys; svid: jwt), so a reader
    of the overview never learnt they exist. Every group whose summary is such a list names all its commands."""
    import itertools

    from cli.main import _command

    def groups(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            if getattr(sub, "commands", None):
                yield f"{path} {name}".strip(), sub
                yield from groups(sub, f"{path} {name}")

    listed = {"svid", "ca", "audit", "policy", "tenant", "group", "workload", "grant", "device", "enforcer", "token",
              "fabric node", "fabric leaf", "fabric spine", "fabric link", "fabric placement"}
    seen = set()
    for path, group in groups(_command(), ""):
        if path not in listed:
            continue
        seen.add(path)
        summary = (group.help or "").split("\n\n")[0]
        tokens = re.findall(r"[a-z0-9]+", summary.lower())
        pairs = {f"{a}{sep}{b}" for a, b in itertools.pairwise(tokens) for sep in ("", "-")}
        missing = [c for c in group.commands if c not in {*tokens, *pairs}]  # `roll back` names rollback
        assert missing == [], (path, summary, missing)
    assert seen == listed


def test_every_command_s_help_names_what_it_acts_on() -> None:
    """`fabric leaf list --help` read "Every one, with its ports and cables." and `fabric spine show --help` "(and,
    for a node, the workloads placed on it)": texts shared by the node, leaf and spine groups. Each says its own."""
    from cli.main import _command

    root: Any = _command()
    fabric = root.commands["fabric"]
    for kind, one in (("node", "GPU node"), ("leaf", "leaf switch"), ("spine", "spine switch")):
        helps = {verb: (cmd.help or "").split("\n")[0] for verb, cmd in fabric.commands[kind].commands.items()}
        assert helps["list"] == f"Every {one}, with its ports and cables.", helps
        assert helps["show"].startswith(f"One {one}, with its ports and cables"), helps
        assert helps["remove"].startswith(f"Remove a {one} and its cables"), helps
        assert helps["add"].startswith(f"Add a {one} with its"), helps
        assert ("placed on it" in helps["show"]) == (kind == "node"), helps
