"""`trustfabric init` and `serve` take the trust domain the README says they do: --trust-domain, else
TRUSTFABRIC_TRUST_DOMAIN, else trustfabric.local for a new data directory, and whatever an existing one holds.
A variable that names no trust domain is refused before anything is written (the environment's mistake: exit 1,
naming the variable), never replaced by the default or found out after the keys were made."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import run_cli


def _env(home: Path, **extra: str) -> dict[str, str | None]:
    return {"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_CONFIG": str(home.parent / "no-config.yaml"),
            "TRUSTFABRIC_MODE": "development", "COLUMNS": "200", **extra}


def _trust_domain(home: Path) -> str:
    r = run_cli(["init", "--json"], _env(home))  # a second init changes nothing and says which domain it holds
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["trust_domain"])


def test_init_takes_the_trust_domain_from_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = run_cli(["init"], _env(home, TRUSTFABRIC_TRUST_DOMAIN="example.org"))
    assert r.returncode == 0, r.stderr
    assert "initialised trust domain spiffe://example.org" in r.stdout
    assert _trust_domain(home) == "example.org"


def test_init_without_a_flag_keeps_the_existing_trust_domain(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run_cli(["init", "--trust-domain", "example.org"], _env(home)).returncode == 0
    again = run_cli(["init"], _env(home))  # no flag, no variable: nothing to change, not "cannot become ..."
    assert again.returncode == 0, again.stderr
    assert "nothing changed" in again.stdout


def test_a_bad_trust_domain_variable_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    for command in (["init"], ["serve", "--port", "1"]):
        home = tmp_path / command[0]
        r = run_cli(command, _env(home, TRUSTFABRIC_TRUST_DOMAIN="Bad Domain"))
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert r.stderr.startswith("error: TRUSTFABRIC_TRUST_DOMAIN") and len(r.stderr.strip().splitlines()) == 1
        assert not home.exists(), (command, sorted(p.name for p in home.iterdir()))


def test_serve_on_a_port_in_use_fails_in_one_line_with_exit_1(tmp_path: Path) -> None:
    """uvicorn ends a server that cannot bind with its own exit code 3 (STARTUP_FAILURE), which the CLI's scheme
    gives to `audit verify` alone, after init has run; the address is checked first: exit 1, naming it."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "home"
        r = run_cli(["serve", "--port", str(port)], _env(home))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and r.stderr.count("\n") == 1, r.stderr
    assert not home.exists()  # refused before init made anything


def test_pdp_on_a_port_in_use_fails_in_one_line_with_exit_1(tmp_path: Path) -> None:
    import socket

    from policy.shipped import REGO_DIR

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli(["pdp", "--port", str(port), "--rego", str(REGO_DIR)], _env(tmp_path / "home"))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and r.stderr.count("\n") == 1, r.stderr
