"""The README's short tour, run against a real `trustfabric serve` (the installed binary, a fresh folder with
the checkout's files the tour uses, its own port and home, the variables `make run` sets and those the README
puts before it): every line of the block as written, only the port, the grant id a person would copy from
`grant list` and the editor filled in. If the README and the product part ways, this fails.

The lines are run by a small interpreter of the shell they use (`VAR=value`, `export VAR=value`, `$VAR`,
`|`, `&&`, `> file`, `# comments`, a line continued with a backslash, and the commands `trustfabric`,
`tail -1`, `cp -r`, `curl -s`), the `trustfabric` commands in-process as the rest of tests/cli does
(tests/cli/conftest.py: real argument parsing, exit codes and output, no interpreter start per command), so
the whole tour takes seconds. Anything else in the block fails the test, naming the construct, rather than
being skipped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from policy.shipped import REGO_DIR
from tests.cli.conftest import run_cli
from tests.policy.conftest import free_port
from tests.servers import serve_binary

ROOT = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent / "trustfabric")
EDIT = "sed -i '1a # reviewed in the README tour' my-rego/flows.rego"  # what the person types in $EDITOR
pytestmark = pytest.mark.xdist_group("binary-servers")


ASSIGNMENT = r"(?:^|\s)([A-Z][A-Z0-9_]*)=(\S+)(?=\s)"


def make_run_environment() -> dict[str, str]:
    """The variables `make run` sets for the server (`NAME=value` before the command in its recipe)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index(next(line for line in lines if line.startswith("run:"))) + 1].strip()
    return dict(re.findall(ASSIGNMENT, recipe.split("trustfabric serve")[0]))


def readme_start_environment() -> dict[str, str]:
    """The variables the README's tour puts before `make run` (`TRUSTFABRIC_TRUST_DOMAIN=example.org make run`:
    the example fabric's trust domain, which `serve` uses when it initialises)."""
    text = (ROOT / "README.md").read_text()
    intro = text[text.index("## A short tour"):text.index("```sh", text.index("## A short tour"))]
    started = re.search(r"`([^`]*)make run`", intro)
    assert started, "the tour says how the server is started: `... make run`"
    return dict(re.findall(ASSIGNMENT, " " + started.group(1)))


def tour_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A short tour"):]
    start = section.index("```sh\n") + 6
    block = section[start:section.index("\n```", start)].replace("\\\n", " ")  # a line continued with \
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


class Tour:
    """Runs tour lines in `cwd` with `env`; every command must succeed (like `set -e`)."""

    def __init__(self, cwd: Path, env: dict[str, str | None], port: int) -> None:
        self.cwd, self.env, self.port = cwd, env, port
        self.vars: dict[str, str] = {}
        self.transcript: list[str] = []

    def line(self, text: str) -> None:
        text = text.replace("127.0.0.1:8443", f"127.0.0.1:{self.port}").replace("<grant-id>", self.pending_grant())
        assignment = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S+)", text.strip())
        if assignment:
            self.vars[assignment.group(1)] = assignment.group(2)
            return
        words = shlex.split(text, comments=True)
        exported = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S+)", words[1]) if words[:1] == ["export"] and len(
            words) == 2 else None
        if exported:  # the commands that follow see it
            self.env[exported.group(1)] = self.expand(exported.group(2))
            return
        for part in text.split(" && "):
            self.pipeline(part)

    def pipeline(self, text: str) -> None:
        words = shlex.split(text, comments=True)
        target = None
        if ">" in words:
            at = words.index(">")
            words, target = words[:at], words[at + 1]
        data: str | None = None
        stage: list[str] = []
        for word in [*words, "|"]:
            if word != "|":
                stage.append(self.expand(word))
                continue
            data = self.run(stage, data)
            stage = []
        if target is not None:
            (self.cwd / target).write_text(data or "")

    def expand(self, word: str) -> str:
        return re.sub(r"\$([A-Z][A-Z0-9_]*)", lambda m: self.vars.get(m.group(1), m.group(0)), word)

    def run(self, argv: list[str], stdin: str | None) -> str:
        name, args = argv[0], argv[1:]
        self.transcript.append(" ".join(argv))
        if name == ".venv/bin/trustfabric":
            r = run_cli(args, self.env, input=stdin)
            self.transcript.append(r.stdout + r.stderr)
            assert r.returncode == 0, "\n".join(self.transcript[-12:])
            return r.stdout
        if name == "tail" and args == ["-1"]:
            return (stdin or "").splitlines()[-1] + "\n"
        if name == "cp" and args[0] == "-r":
            shutil.copytree(self.cwd / args[1], self.cwd / args[2])
            return ""
        if name == "curl" and args[0] == "-s":
            return httpx.get(f"http://{args[1]}", timeout=10).raise_for_status().text
        if name == "$EDITOR":
            subprocess.run(EDIT, shell=True, cwd=self.cwd, check=True)
            return ""
        raise AssertionError(f"the README tour uses {name!r}, which this test cannot run: teach it, or keep the "
                             "tour to trustfabric, curl, cp, tail, pipes, && and > files")

    def pending_grant(self) -> str:
        if not any("grant request" in t for t in self.transcript):
            return "<grant-id>"
        found = re.findall(r"grant (g-[0-9a-f]{12}-[0-9a-f]{16}): pending", "\n".join(self.transcript))
        return found[-1] if found else "<grant-id>"


def test_the_tour_needs_only_these_fillings() -> None:
    lines = tour_lines()
    assert lines[0] == "T=.venv/bin/trustfabric" and len(lines) > 25
    placeholders = {p for line in lines for p in re.findall(r"<[a-z-]+>|\$EDITOR", line)}
    assert placeholders == {"<grant-id>", "$EDITOR"}
    assert not any("TRUSTFABRIC_TOKEN" in line for line in lines)  # nobody pastes a token into the environment


def test_the_readme_tour_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(REGO_DIR, tmp_path / "rego")  # the files of the checkout the tour uses
    shutil.copytree(ROOT / "enforcer" / "examples", tmp_path / "enforcer" / "examples")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRUSTFABRIC_", "XDG_", "OTEL_", "PROMETHEUS_"))}
    env.update({"HOME": str(tmp_path), "COLUMNS": "100", "TRUSTFABRIC_LOG_LEVEL": "warning"})
    monkeypatch.chdir(tmp_path)  # the person is in the folder make run serves
    shell_env: dict[str, str | None] = {"HOME": str(tmp_path), "COLUMNS": "100", "XDG_CONFIG_HOME": None}
    tour = Tour(tmp_path, shell_env, port)
    server_env = {**env, **make_run_environment(), **readme_start_environment()}
    with serve_binary([BIN, "serve", "--port", str(port)], port=port, env=server_env, cwd=tmp_path):
        for line in tour_lines():
            tour.line(line)
    out = "\n".join(tour.transcript)
    assert "signed in to http://127.0.0.1" in out and "(admin)" in out
    assert "the current profile stays 'default'" in out
    assert re.search(r"grant g-[0-9a-f-]+: pending", out) and re.search(r"grant g-[0-9a-f-]+: active", out)
    assert "ALLOW acme/train -> globex/api tcp/8443" in out
    assert "placements: added 6" in out and "ct(commit,zone=" in out and "nv set vrf vrf10001" in out
    assert "= version 1's content, pinned" in out and "ok: the published rule sets do what the active policy" in out
    assert re.search(r"^PASS: (\d+)/\1$", out, re.MULTILINE) and "coverage:" in out
    assert "version 2 uploaded" in out and "version 2 (" in out and "is active" in out
    assert out.count("OK: ") == 3  # the host's two exports and the auditor's download verified offline
    assert "selection: tenant acme" in out.rsplit("OK: ", 1)[1]  # the download's, of the filter it was asked
    assert (tmp_path / ".config" / "trustfabric" / "config.yaml").stat().st_mode & 0o077 == 0
    assert "\n— " in (tmp_path / "kept.note").read_text()  # the signed checkpoint note, kept


def test_the_tour_exports_what_make_run_sets() -> None:
    """The tour's local commands (token create, policy upload, policy activate) open the data directory `make
    run` serves, in another shell: without the variables `make run` sets for the server (development mode),
    `policy activate` there refuses what the server itself would accept."""
    server = make_run_environment()
    assert server.get("TRUSTFABRIC_MODE") == "development"  # the parse works
    exported = dict(re.findall(r"^export ([A-Z][A-Z0-9_]*)=(\S+)", "\n".join(tour_lines()), re.MULTILINE))
    assert exported == server
