"""The README's short tour, run as a script against a real `trustfabric serve` (the installed binary, a fresh
folder, its own port and home): every command as written, only the port, the grant id a person would copy
from `grant list` and the editor filled in. If the README and the product part ways, this fails."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from policy.shipped import REGO_DIR
from tests.policy.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent / "trustfabric")
pytestmark = pytest.mark.xdist_group("binary-servers")


def make_run_environment() -> dict[str, str]:
    """The variables `make run` sets for the server (`NAME=value` before the command in its recipe)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index(next(line for line in lines if line.startswith("run:"))) + 1].strip()
    return dict(re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=(\S+)(?=\s)", recipe.split("trustfabric serve")[0]))


def tour_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A short tour"):]
    block = section[section.index("```sh\n") + 6:section.index("\n```", section.index("```sh\n"))]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


EDIT = "sed -i '1a # reviewed in the README tour' my-rego/flows.rego"  # what the person types in $EDITOR


def as_script(commands: list[str], port: int) -> str:
    helper = ('tour_grant_id() { "$T" --profile globex grant list --state pending --json | '
              "python3 -c 'import json,sys; print(json.load(sys.stdin)[0][\"id\"])'; }")
    lines = ["set -euo pipefail", helper]
    for command in commands:
        filled = (command.replace(".venv/bin/trustfabric", BIN).replace("127.0.0.1:8443", f"127.0.0.1:{port}")
                  .replace("<grant-id>", '"$(tour_grant_id)"')
                  .replace("$EDITOR my-rego/flows.rego", EDIT))
        lines += [f"echo '@@ {command.split('#')[0].strip()}' | tr -d \"'\"", filled]
    return "\n".join(lines) + "\n"


def test_the_tour_needs_only_these_fillings() -> None:
    commands = tour_commands()
    assert commands[0] == "T=.venv/bin/trustfabric" and len(commands) > 25
    placeholders = {p for c in commands for p in re.findall(r"<[a-z-]+>|\$EDITOR", c)}
    assert placeholders == {"<grant-id>", "$EDITOR"}
    assert not any("TRUSTFABRIC_TOKEN" in c for c in commands)  # nobody pastes a token into the environment


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (Makefile SYSTEM_TOOLS installs it as root)")
    shutil.copytree(REGO_DIR, tmp_path / "rego")
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRUSTFABRIC_", "XDG_", "OTEL_", "PROMETHEUS_"))}
    env.update({"HOME": str(tmp_path), "COLUMNS": "100", "TRUSTFABRIC_LOG_LEVEL": "warning"})
    server = subprocess.Popen([BIN, "serve", "--port", str(port)], env={**env, **make_run_environment()}, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start: {server.stderr.read() if server.stderr else ''}")
            time.sleep(0.1)
        script = tmp_path / "tour.sh"
        script.write_text(as_script(tour_commands(), port))
        r = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
        shown = f"--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-3000:]}"
        assert r.returncode == 0, shown
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    out = r.stdout
    assert "signed in to http://127.0.0.1" in out and "(admin)" in out
    assert "the current profile stays 'default'" in out
    assert re.search(r"grant g-[0-9a-f-]+: pending", out) and re.search(r"grant g-[0-9a-f-]+: active", out)
    assert "ALLOW acme/train -> globex/api tcp/8443" in out
    assert re.search(r"^PASS: (\d+)/\1$", out, re.MULTILINE) and "coverage:" in out
    assert "version 2 uploaded" in out and "version 2 (" in out and "is active" in out
    assert out.count("OK: ") == 2  # both exports verified offline
    assert (tmp_path / ".config" / "trustfabric" / "config.yaml").stat().st_mode & 0o077 == 0
