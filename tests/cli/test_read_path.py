"""The read-only path of `policy list` and `ca status` (store/readonly.py: sqlite3, no SQLAlchemy) answers
exactly what the full path (the services through SQLAlchemy) answers on the same data directory, is taken
only when it can be (the embedded SQLite database at the current schema), and changes nothing on disk."""

from __future__ import annotations

import json
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from policy.shipped import REGO_DIR
from tests.cli.conftest import run_cli
from tests.cli.test_import_diet import DATABASE, loaded_by
from workflows.readonly import SCHEMA_VERSION, open_read_only
from workflows.settings import Settings

FAILING_TEST = "package extra_test\n\nimport rego.v1\n\ntest_fails if 1 == 2\n\ntest_passes if 1 == 1\n"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A data directory with two policy versions (the second with a failing test) and two CA generations
    (the first retired): every column kind the readers decode (JSON, BOOLEAN, DATETIME, NULL)."""
    base = tmp_path_factory.mktemp("read-path")
    env = {"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_CONFIG": str(base / "none.json"),
           "TRUSTFABRIC_MODE": "development", "COLUMNS": "200"}
    assert run_cli(["init", "--trust-domain", "example.org"], env).returncode == 0
    rego = base / "rego"
    shutil.copytree(REGO_DIR, rego)
    (rego / "extra_test.rego").write_text(FAILING_TEST)
    assert run_cli(["policy", "upload", str(rego), "--note", "a failing test"], env).returncode == 1
    assert run_cli(["ca", "rotate", "--force"], env).returncode == 0
    yield env


def settings_of(env: dict[str, str]) -> Settings:
    return Settings.from_env(env)


def full_path(env: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What the services answer through SQLAlchemy (as the API does)."""
    from pki import schedule
    from pki import service as pki
    from policy import service as policy
    from policy.views import version_out
    from workflows.context import AppContext

    ctx = AppContext.open(settings_of(env))
    try:
        with ctx.db.read_session() as s:
            versions = [version_out(v).model_dump(mode="json") for v in policy.list_versions(s)]
            status = schedule.status_dict(pki.ca_status(s, ctx.clock))
    finally:
        ctx.close()
    return versions, status


def test_read_only_answers_equal_the_full_path(home: dict[str, str]) -> None:
    db = open_read_only(settings_of(home))
    assert db is not None  # this data directory takes the read-only path
    db.close()
    versions = json.loads(run_cli(["policy", "list", "--json"], home).stdout)
    status = json.loads(run_cli(["ca", "status", "--json"], home).stdout)
    assert (versions, status) == full_path(home)
    assert [(v["number"], v["tests_passed"], v["tests_failing"]) for v in versions] == [
        (1, True, []), (2, False, ["extra_test.test_fails"])]
    assert [c["state"] for c in status["cas"]] == ["retired", "retired", "active", "active"]  # g1 signed nothing
    assert status["active_generation"] == 2 and status["next_prepare_at"] is not None


def test_the_read_only_commands_load_no_database_library(home: dict[str, str]) -> None:
    codes, loaded = loaded_by(["policy", "list"], ["ca", "status"], env=home)
    assert codes == [0, 0]
    assert not loaded & set(DATABASE), sorted(loaded & set(DATABASE))


def test_reading_changes_nothing_and_keeps_the_files_private(home: dict[str, str]) -> None:
    db_file = Path(home["TRUSTFABRIC_HOME"]) / "trustfabric.db"
    before = db_file.read_bytes()
    assert run_cli(["policy", "list"], home).returncode == 0
    assert run_cli(["ca", "status"], home).returncode == 0
    assert db_file.read_bytes() == before
    for f in db_file.parent.glob("trustfabric.db*"):  # the -wal / -shm a reader may create
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_the_read_only_path_only_where_it_can(home: dict[str, str], tmp_path: Path) -> None:
    from store.readonly import open_readonly

    settings = settings_of(home)
    assert open_readonly(settings.home, SCHEMA_VERSION + 1) is None  # another schema: the full path migrates
    assert open_readonly(tmp_path, SCHEMA_VERSION) is None  # no database
    assert open_read_only(replace(settings, database_url="postgresql://x@127.0.0.1:1/x")) is None


def test_a_missing_data_directory_fails_as_before(tmp_path: Path) -> None:
    """The read path and the full one fail alike; the line says to run where the data directory is (it said
    only "run `trustfabric init` first", which on a security engineer's laptop makes a second trust domain)."""
    env = {"TRUSTFABRIC_HOME": str(tmp_path / "nothing"), "TRUSTFABRIC_CONFIG": str(tmp_path / "none.json")}
    for argv in (["policy", "list"], ["ca", "status"], ["token", "create", "--role", "admin"]):
        r = run_cli(argv, env)
        assert r.returncode == 1 and "does not exist: this command runs on the server host" in r.stderr, r.stderr
        assert "set TRUSTFABRIC_HOME" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "nothing").exists()


def test_the_constants_follow_the_models_and_migrations() -> None:
    from pki import schedule
    from pki.models import CertificateAuthority, TrustDomainSettings
    from policy import reads
    from policy.models import PolicyVersion
    from workflows.schema import STEPS

    assert max(step.version for step in STEPS) == SCHEMA_VERSION
    assert PolicyVersion.__tablename__ == reads.TABLE
    assert CertificateAuthority.__tablename__ == schedule.CAS_TABLE
    assert TrustDomainSettings.__tablename__ == schedule.SETTINGS_TABLE
