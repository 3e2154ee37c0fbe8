"""Sign-in like `tsh login`: profiles in the config file (0600 in a 0700 directory, written atomically),
several of them, --profile / TRUSTFABRIC_PROFILE, the environment overriding, logout, status; a file others
can read that holds a token is refused; local commands take the data directory from the profile."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import Cli

REGO = str(Path(__file__).resolve().parents[2] / "rego")


@pytest.fixture
def signed(cli: Cli, tmp_path: Path) -> dict[str, object]:
    """The CLI environment of a person with no token or server in the environment, only a config home."""
    env: dict[str, str | None] = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "TRUSTFABRIC_CONFIG": None,
                                  "TRUSTFABRIC_SERVER": None, "TRUSTFABRIC_TOKEN": None}
    admin = cli.token("--role", "admin", "--ttl", "1h")
    cli.run("tenant", "create", "acme", "--display-name", "Acme", token=admin)
    acme = cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")
    return {"env": env, "admin": admin, "acme": acme, "server": cli.env["TRUSTFABRIC_SERVER"],
            "config": tmp_path / "xdg" / "trustfabric" / "config.yaml"}


def test_login_keeps_a_private_profile_and_commands_use_it(cli: Cli, signed: dict[str, object]) -> None:
    env = signed["env"]
    assert isinstance(env, dict)
    r = cli.run("login", "--server", str(signed["server"]), "--token-stdin", input=f"{signed['admin']}\n", **env)
    assert r.returncode == 0 and "signed in to" in r.stdout and "(admin)" in r.stdout, r.stderr
    config = signed["config"]
    assert isinstance(config, Path)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    doc = yaml.safe_load(config.read_text())
    assert doc["current"] == "default" and doc["profiles"]["default"]["server"] == signed["server"]
    who = cli.run("whoami", "--json", **env)
    assert who.returncode == 0 and json.loads(who.stdout)["role"] == "admin"

    # a second, named profile: the current one stays; --profile and TRUSTFABRIC_PROFILE choose
    r = cli.run("--profile", "acme", "login", "--server", str(signed["server"]), "--token", str(signed["acme"]), **env)
    assert r.returncode == 0 and "(tenant-admin@acme)" in r.stdout and "current profile stays 'default'" in r.stdout
    assert json.loads(cli.run("whoami", "--json", **env).stdout)["role"] == "admin"
    assert json.loads(cli.run("--profile", "acme", "whoami", "--json", **env).stdout)["tenant"] == "acme"
    assert json.loads(cli.run("whoami", "--json", **env, TRUSTFABRIC_PROFILE="acme").stdout)["tenant"] == "acme"
    # the file is plain YAML: make acme current by hand
    config_doc = yaml.safe_load(Path(str(signed["config"])).read_text())
    config_doc["current"] = "acme"
    Path(str(signed["config"])).write_text(yaml.safe_dump(config_doc))
    # the environment overrides the profile
    over = cli.run("whoami", "--json", **{**env, "TRUSTFABRIC_TOKEN": str(signed["admin"])})
    assert json.loads(over.stdout)["role"] == "admin"

    status = cli.run("status", **env)
    assert status.returncode == 0 and "signed in as" in status.stdout and "acme" in status.stdout
    assert str(signed["acme"]) not in status.stdout and str(signed["admin"]) not in status.stdout
    as_json = json.loads(cli.run("status", "--json", **env).stdout)
    assert [p["name"] for p in as_json["profiles"]] == ["acme", "default"] and as_json["profile"] == "acme"
    assert str(signed["acme"]) not in json.dumps(as_json)

    unknown = cli.run("--profile", "nope", "whoami", **env)  # a name on the command line: usage
    assert unknown.returncode == 2 and "--profile nope: no such profile" in unknown.stderr, unknown.stderr
    unknown = cli.run("whoami", **env, TRUSTFABRIC_PROFILE="nope")  # the environment's: a failure
    assert unknown.returncode == 1 and "no profile 'nope'" in unknown.stderr, unknown.stderr

    out = cli.run("logout", **env)
    assert out.returncode == 0 and "'acme'" in out.stdout
    refused = cli.run("whoami", **env)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr
    assert cli.run("status", **env).returncode == 1  # the server refuses: not signed in
    assert cli.run("--profile", "default", "whoami", **env).returncode == 0
    assert cli.run("logout", "--all", **env).returncode == 0
    assert all("token" not in p for p in yaml.safe_load(config.read_text())["profiles"].values())


def test_a_refused_token_writes_nothing(cli: Cli, signed: dict[str, object]) -> None:
    env = signed["env"]
    assert isinstance(env, dict)
    r = cli.run("login", "--server", str(signed["server"]), "--token", "tfo_wrong", **env)
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    assert not Path(str(signed["config"])).exists()
    r = cli.run("login", "--server", "127.0.0.1:8443", "--token", "x", **env)
    assert r.returncode == 2 and "http://" in r.stderr
    r = cli.run("login", "--token-stdin", input="x\n", **env)
    assert r.returncode == 2 and "no server yet" in r.stderr


def test_a_config_file_others_can_read_is_refused_when_it_holds_a_token(cli: Cli, signed: dict[str, object]) -> None:
    env = signed["env"]
    assert isinstance(env, dict)
    assert cli.run("login", "--server", str(signed["server"]), "--token", str(signed["admin"]), **env).returncode == 0
    config = Path(str(signed["config"]))
    config.chmod(0o640)
    r = cli.run("whoami", **env)
    assert r.returncode == 1 and "chmod 600" in r.stderr and r.stderr.count("\n") == 1
    config.write_text(yaml.safe_dump({"current": "x", "profiles": {"x": {"server": str(signed["server"])}}}))
    r = cli.run("whoami", **env)  # no token in it: readable is fine, the server says who is missing
    assert r.returncode == 1 and "HTTP 401" in r.stderr


def test_local_commands_take_the_data_directory_from_the_profile(cli: Cli, signed: dict[str, object],
                                                                tmp_path: Path) -> None:
    env = signed["env"]
    assert isinstance(env, dict)
    home = cli.env["TRUSTFABRIC_HOME"]
    r = cli.run("login", "--server", str(signed["server"]), "--token", str(signed["admin"]), "--home", str(home),
                **env)
    assert r.returncode == 0, r.stderr
    without = {**env, "TRUSTFABRIC_HOME": None}
    listed = cli.run("policy", "list", "--json", **without)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["number"] == 1, listed.stderr
    elsewhere = cli.run("policy", "list", **{**env, "TRUSTFABRIC_HOME": str(tmp_path / "nowhere")})
    assert elsewhere.returncode == 1 and "does not exist" in elsewhere.stderr  # the environment wins


def test_a_profile_named_on_the_command_line_must_exist_for_every_command(cli: Cli, signed: dict[str, object],
                                                                          tmp_path: Path) -> None:
    """Should fix: `--profile nope` was ignored by the offline commands, and by the local ones when TRUSTFABRIC_HOME
    named the data directory: a mistyped name ran the command without the profile its caller asked for. Now a usage
    error before any work for every command but login (which makes the profile)."""
    env = signed["env"]
    assert isinstance(env, dict)
    home = tmp_path / "never-made"
    for argv, extra in ((("policy", "validate", REGO), {}),  # offline: files only
                        (("init", "--trust-domain", "nope.example"), {"TRUSTFABRIC_HOME": str(home)}),  # local
                        (("status",), {}), (("logout",), {})):
        r = cli.run("--profile", "nope", *argv, **{**env, **extra})
        assert r.returncode == 2 and "--profile nope: no such profile" in r.stderr, (argv, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not home.exists()  # init did no work
    assert cli.run("policy", "validate", REGO, **env).returncode == 0  # the same line without it runs
    made = cli.run("--profile", "nope", "login", "--server", str(signed["server"]), "--token-stdin",
                   input=f"{signed['admin']}\n", **env)
    assert made.returncode == 0 and "profile 'nope' saved" in made.stdout, made.stderr
    assert cli.run("--profile", "nope", "policy", "validate", REGO, **env).returncode == 0


def test_help_is_shown_whatever_profile_is_named(cli: Cli, signed: dict[str, object]) -> None:
    """Should fix: `--profile typo tenant --help` gave the usage error of the missing profile instead of the help
    text: help does no work, and its text is what such a caller needs. The command itself is still refused."""
    env = signed["env"]
    assert isinstance(env, dict)
    for argv in (("tenant", "--help"), ("policy", "validate", "--help"), ("--help",)):
        r = cli.run("--profile", "nope", *argv, **env)
        assert r.returncode == 0 and "Usage: trustfabric" in r.stdout, (argv, r.returncode, r.stderr)
    r = cli.run("--profile", "nope", "tenant", "list", **env)
    assert r.returncode == 2 and "--profile nope: no such profile" in r.stderr, r.stderr


def test_a_server_url_with_credentials_is_never_printed_with_them(cli: Cli, signed: dict[str, object],
                                                                  tmp_path: Path) -> None:
    """`https://user:pass@host` given as --server, TRUSTFABRIC_SERVER or a profile's server: every line that names
    the server (cannot reach, a refused token's next step, a malformed URL, `login`, `status` and its --json)
    shows `***@host`, never the password."""
    from tests.policy.conftest import free_port

    env = signed["env"]
    assert isinstance(env, dict)
    closed = f"http://alice:s3cret@127.0.0.1:{free_port()}"
    shown = "http://***@" + closed.split("@", 1)[1]
    for argv in (["whoami", "--server", closed], ["device", "list", "--server", closed],
                 ["login", "--server", closed, "--token-stdin"]):
        r = cli.run(*argv, token=str(signed["admin"]), input=f"{signed['admin']}\n", **env)
        assert r.returncode == 1 and f"cannot reach {shown}" in r.stderr and "s3cret" not in r.stderr, r.stderr
    r = cli.run("whoami", token=str(signed["admin"]), **{**env, "TRUSTFABRIC_SERVER": closed})
    assert r.returncode == 1 and shown in r.stderr and "s3cret" not in r.stderr, r.stderr
    r = cli.run("whoami", "--server", "http://alice:s3cret@127.0.0.1:99999", **env)
    assert r.returncode == 2 and "***@127.0.0.1:99999" in r.stderr and "s3cret" not in r.stderr, r.stderr

    live = str(signed["server"]).replace("://", "://alice:s3cret@", 1)
    r = cli.run("login", "--server", live, "--token-stdin", input=f"{signed['admin']}\n", **env)
    assert r.returncode == 0 and "signed in to http://***@" in r.stdout and "s3cret" not in r.stdout, r.stdout
    config = signed["config"]
    assert isinstance(config, Path)
    doc = yaml.safe_load(config.read_text())
    doc["profiles"]["default"]["token"] = "not-a-token-" + "x" * 40  # refused: the hint names the profile's URL
    config.write_text(yaml.safe_dump(doc))
    r = cli.run("whoami", **env)
    assert r.returncode == 1 and "login --server http://***@" in r.stderr and "s3cret" not in r.stderr, r.stderr
    for argv in (["status"], ["status", "--json"], ["status", "--offline"]):
        r = cli.run(*argv, **env)
        assert "***@" in r.stdout and "s3cret" not in r.stdout + r.stderr, (argv, r.stdout, r.stderr)
