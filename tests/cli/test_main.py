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
