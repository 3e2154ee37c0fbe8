"""cli.main.main: whatever fails, one readable line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import run_cli


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """psycopg's message runs on over three lines (a hint, SQLAlchemy's link): only its first is shown."""
    env: dict[str, str | None] = {"TRUSTFABRIC_HOME": str(tmp_path), "TRUSTFABRIC_CONFIG": str(tmp_path / "c.yaml"),
                                  "TRUSTFABRIC_DATABASE_URL": "postgresql://tf@127.0.0.1:1/tf"}
    r = run_cli(["policy", "list"], env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: OperationalError: ") and r.stderr.count("\n") == 1, r.stderr
    assert "port 1 failed" in r.stderr, r.stderr


def test_a_bad_variable_is_one_line_naming_it(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"TRUSTFABRIC_HOME": str(tmp_path), "TRUSTFABRIC_CONFIG": str(tmp_path / "c.yaml"),
                                  "TRUSTFABRIC_QUOTA_GROUPS": "many"}
    r = run_cli(["policy", "list"], env)
    assert (r.returncode, r.stderr) == (1, "error: TRUSTFABRIC_QUOTA_GROUPS='many' is not a whole number\n")


def test_profile_after_the_command_says_where_it_goes(tmp_path: Path) -> None:
    """kubectl's --context and tsh's --proxy go anywhere on the line; trustfabric's --profile before the command
    only. Given after it, the usage error names the line that works, not just `No such option: --profile`."""
    env: dict[str, str | None] = {"TRUSTFABRIC_CONFIG": str(tmp_path / "c.yaml")}
    r = run_cli(["grant", "show", "g-01a2", "--profile", "acme", "--json"], env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "`trustfabric --profile acme grant show g-01a2 --json`" in r.stderr, r.stderr
    r = run_cli(["tenant", "list", "--profile=ops"], env)
    assert r.returncode == 2 and "`trustfabric --profile ops tenant list`" in r.stderr, r.stderr
    r = run_cli(["tenant", "list", "--nosuch"], env)  # any other unknown option: as before
    assert r.returncode == 2 and "(see `trustfabric tenant list --help`)" in r.stderr, r.stderr


def test_a_data_directory_that_is_a_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """TRUSTFABRIC_HOME naming a file: `policy list` said `NotADirectoryError: [Errno 20] Not a directory:
    '.../trustfabric.db'`, `init` blamed TRUSTFABRIC_TRUST_DOMAIN; each local command now names the folder."""
    home = tmp_path / "a-file"
    home.write_text("not a folder\n")
    env: dict[str, str | None] = {"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_CONFIG": str(tmp_path / "c.yaml")}
    for argv in (["policy", "list"], ["ca", "status"], ["init"], ["token", "create", "--role", "admin"]):
        r = run_cli(argv, env)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (argv, r.stderr)
        assert r.stderr == f"error: {home} is not a folder: the data directory is one (TRUSTFABRIC_HOME, else the " \
                           "profile's home, else ./.trustfabric)\n", (argv, r.stderr)
    assert home.read_text() == "not a folder\n"
