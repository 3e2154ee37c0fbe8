"""CLI test harness: commands run in-process (cli.main.main under typer's CliRunner isolation: the real
argument parsing, exit codes and one-line errors, no interpreter start per command) against a real data
directory, and the remote commands against the real API served by uvicorn on 127.0.0.1 in this process.
tests/cli/test_smoke.py runs the installed `trustfabric` binary once per command group."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from cli.main import main
from tests.policy.conftest import free_port


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], env: Mapping[str, str | None], input: str | None = None) -> Run:
    """One command, in-process, with `env` as its environment (the rest of os.environ's TRUSTFABRIC_*
    variables removed; a None value removes that variable) and `input` as its standard input."""
    import os

    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TRUSTFABRIC_")}
    clean.update(env)
    # A command configures the process's logging as its own process would (main's basicConfig; `serve` and `pdp`
    # core.logs.configure) on the stderr of this isolation, closed when it ends: kept, the API server this process
    # serves for other tests logs into that closed stream, and logging's ValueError turns its answers into 500s.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with CliRunner().isolation(input=input, env=clean) as (out, err, _):
            try:
                main(args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
            return Run(code, out.getvalue().decode(), err.getvalue().decode())
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


class Cli:
    def __init__(self, home: Path, server: str, cwd: Path) -> None:
        self.env = {"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_SERVER": server,
                    "TRUSTFABRIC_CONFIG": str(cwd / "no-config.json"), "COLUMNS": "200",
                    "TRUSTFABRIC_MODE": "development"}
        self.cwd = cwd

    def run(self, *args: str, token: str | None = None, input: str | None = None, **env: str | None) -> Run:
        e: dict[str, str | None] = {**self.env, **env}
        if token:
            e["TRUSTFABRIC_TOKEN"] = token
        return run_cli(list(args), e, input=input)

    def json(self, *args: str, token: str | None = None) -> Any:
        """The command's --json output, parsed (as a response's .json(): whatever JSON the command printed)."""
        r = self.run(*args, "--json", token=token)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return json.loads(r.stdout)

    def token(self, *args: str) -> str:
        r = self.run("token", "create", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]


class ServedApi:
    """The API as `trustfabric serve` builds it (app_from_env), served by uvicorn in a thread."""

    def __init__(self, env: dict[str, str]) -> None:
        import os

        from api.app import create_app
        from workflows.context import AppContext
        from workflows.settings import Settings

        self.port = free_port()
        # no rate limits (as tests/servers.py's servers): a module's commands come from one principal, and on a fast
        # machine a view test's hundred-odd calls within two seconds drained the default burst of 100 (a 429 at random)
        self.ctx = AppContext.open(Settings.from_env({**{k: v for k, v in os.environ.items()}, **env,
                                                      "TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "0",
                                                      "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND": "0"}))
        config = uvicorn.Config(create_app(self.ctx), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"api-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the API did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.ctx.close()


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """A data directory made by the real `init`, and the API served over it."""
    base = tmp_path_factory.mktemp("cli")
    c = Cli(base / "home", "", base)
    init = c.run("init", "--trust-domain", "example.org")
    assert init.returncode == 0, init.stderr
    served = ServedApi(c.env)
    c.env["TRUSTFABRIC_SERVER"] = served.url
    try:
        yield c
    finally:
        served.stop()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory made by the real `trustfabric init`, with acme/web/web-1 registered and a CSR
    in req.pem; the environment points the CLI at it (for the local commands, no server)."""
    from typer.testing import CliRunner

    from audit import Actor
    from cli.main import app
    from inventory import service as inv
    from tests.pki.helpers import make_csr
    from workflows.context import AppContext
    from workflows.settings import Settings

    monkeypatch.setenv("TRUSTFABRIC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRUSTFABRIC_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("TRUSTFABRIC_MODE", "development")
    monkeypatch.delenv("TRUSTFABRIC_DATABASE_URL", raising=False)
    r = CliRunner().invoke(app, ["init", "--trust-domain", "example.org", "--json"])
    assert r.exit_code == 0, r.output
    ctx = AppContext.open(Settings.from_env())
    try:
        with ctx.db.session() as s:
            actor = Actor.system("test")
            inv.create_tenant(s, slug="acme", display_name="Acme", actor=actor, clock=ctx.clock)
            inv.create_group(s, tenant="acme", name="web", actor=actor, clock=ctx.clock)
            inv.register_workload(s, trust_domain="example.org", tenant="acme", group="web", name="web-1",
                                  actor=actor, clock=ctx.clock)
    finally:
        ctx.close()
    (tmp_path / "req.pem").write_bytes(make_csr())
    return tmp_path
