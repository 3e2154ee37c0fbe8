"""What each light command loads: a command starts in < 0.3 s only if it leaves the heavy libraries alone
(SQLAlchemy/SQLModel ~0.2 s, the app and HTTP stacks, regorus, cryptography), so a module that starts
importing one of them at module level (a package `__init__`, a type used only in hints) fails here by
name, not as a slower benchmark. Each case runs the real `cli.main.main` in a fresh interpreter and reads
`sys.modules` after it; bench/cli.py has the timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
DATABASE = ("sqlalchemy", "sqlmodel")
SERVER = ("fastapi", "starlette", "uvicorn")
PROBE = """
import json, sys
from cli.main import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code if isinstance(exc.code, int) else 0)
loaded = sorted({name.split(".")[0] for name in sys.modules})
print("\\nPROBE " + json.dumps({"codes": codes, "loaded": loaded}))
"""


def loaded_by(*argvs: list[str], env: dict[str, str] | None = None) -> tuple[list[int], set[str]]:
    """Exit codes of the commands run one after another in one fresh interpreter, and the top-level
    packages loaded by then."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(argvs))], capture_output=True, text=True,
                       timeout=120, env={**clean, "COLUMNS": "100", **(env or {})}, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.rsplit("\nPROBE ", 1)[1])
    return report["codes"], set(report["loaded"])


def every_command() -> list[list[str]]:
    import typer

    from cli.main import app

    def walk(cmd: object, path: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", None)
        if not subs:
            return [path]
        return [p for name, sub in sorted(subs.items()) for p in walk(sub, [*path, name])]

    return walk(typer.main.get_command(app), [])


def test_version_and_every_help_load_no_database_server_engine_or_crypto() -> None:
    commands = every_command()
    assert len(commands) > 50  # the walk found the tree, not just the root
    codes, loaded = loaded_by(["--version"], ["--help"], *([*c, "--help"] for c in commands))
    assert set(codes) == {0}
    heavy = loaded & {*DATABASE, *SERVER, "httpx", "regorus", "cryptography", "yaml"}
    assert not heavy, f"--version / --help loaded {sorted(heavy)}"


def test_offline_policy_commands_load_regorus_but_no_database_or_crypto() -> None:
    rego = str(REPO / "rego")
    codes, loaded = loaded_by(["policy", "validate", rego], ["policy", "test", rego])
    assert codes == [0, 0]
    assert "regorus" in loaded  # the probe sees what a command really loads
    heavy = loaded & {*DATABASE, *SERVER, "httpx", "cryptography"}
    assert not heavy, f"policy validate/test loaded {sorted(heavy)}"


def test_audit_verify_loads_no_database_and_no_policy_engine(tmp_path: Path) -> None:
    env = {"TRUSTFABRIC_HOME": str(tmp_path / "home"), "TRUSTFABRIC_CONFIG": str(tmp_path / "none.json")}
    assert run_cli(["init", "--trust-domain", "example.org"], env).returncode == 0
    key = tmp_path / "audit.pub"
    key.write_text(run_cli(["audit", "public-key"], env).stdout)
    export = tmp_path / "audit.jsonl"
    assert run_cli(["audit", "export", "--out", str(export)], env).returncode == 0
    codes, loaded = loaded_by(["audit", "verify", str(export), "--public-key", str(key)])
    assert codes == [0]
    assert "cryptography" in loaded  # it did verify signatures
    heavy = loaded & {*DATABASE, *SERVER, "regorus"}
    assert not heavy, f"audit verify loaded {sorted(heavy)}"


@pytest.mark.parametrize("argv", [["tenant", "list"], ["whoami"], ["grant", "list"]])
def test_remote_commands_load_no_database_server_or_engine(argv: list[str]) -> None:
    """Against a closed port: what a remote command loads is decided before it connects."""
    from tests.policy.conftest import free_port

    env = {"TRUSTFABRIC_SERVER": f"http://127.0.0.1:{free_port()}", "TRUSTFABRIC_TOKEN": "x" * 40,
           "TRUSTFABRIC_CONFIG": "/nonexistent/none.json"}
    codes, loaded = loaded_by(argv, env=env)
    assert codes == [1]  # refused connection: one line, exit 1
    assert "http" in loaded  # it did try the API (http.client)
    heavy = loaded & {*DATABASE, *SERVER, "httpx", "regorus"}
    assert not heavy, f"{' '.join(argv)} loaded {sorted(heavy)}"
