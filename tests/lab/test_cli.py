"""`trustfabric lab` as the README's quickstart runs it (in-process, real arguments and exit codes): up the
golden fabric, probe an allowed and a denied pair, add a grant to the file, `lab apply` re-applies only
the devices whose rule set changed, the probe turns OPEN, down. A probe exits 0 OPEN, 1 BLOCKED (as `nc -z`);
bad input ends in one line and exit 1 (2 for usage: a wrong command line), and nothing is built."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lab import build, netops
from tests.cli.conftest import Run, run_cli
from tests.enforcer.helpers import SMALL
from tests.lab.conftest import LAB, require_lab

pytestmark = LAB
GRANT = ("  g-batch-db: {src: globex/batch, dst: acme/data, proto: tcp, ports: [5432], "
         "expires_at: 2099-01-01T00:00:00Z}\n")


class LabCli:
    def __init__(self, home: Path) -> None:
        self.env = {"TRUSTFABRIC_HOME": str(home), "COLUMNS": "200"}

    def __call__(self, *args: str) -> Run:
        return run_cli(["lab", *args], self.env)

    def json(self, *args: str) -> object:
        r = self(*args, "--json")
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return json.loads(r.stdout)


def _one_line_error(r: Run, code: int, words: str) -> None:
    assert r.returncode == code, (r.stdout, r.stderr)
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.fixture
def cli(tmp_path: Path) -> LabCli:
    require_lab()
    return LabCli(tmp_path / "home")


def test_the_quickstart(cli: LabCli, tmp_path: Path) -> None:
    fabric = tmp_path / "fabric.yaml"
    shutil.copy(SMALL, fabric)
    try:
        up = cli("up", str(fabric))
        assert up.returncode == 0 and "up in" in up.stdout and "6 rule sets applied" in up.stdout, up.stderr
        _one_line_error(cli("up", str(fabric)), 1, "already up")
        allowed = cli("probe", "acme/train/w1", "globex/api/a1", "8443")
        assert allowed.returncode == 0 and allowed.stdout.startswith("OPEN") and "grant:g-train-api" in allowed.stdout
        assert "agrees with the wire" in allowed.stdout
        denied = cli("probe", "globex/batch/b1", "acme/data/db1", "5432")
        assert denied.returncode == 1 and denied.stdout.startswith("BLOCKED") and "default-deny" in denied.stdout

        fabric.write_text(fabric.read_text() + GRANT)  # the grants section is the file's last
        applied = cli.json("apply")
        assert applied["applied"] == ["leaf:leaf1", "nic:gpu1", "nic:gpu2"]  # type: ignore[index]
        again = cli.json("probe", "globex/batch/b1", "acme/data/db1", "5432")
        assert again["result"] == "OPEN" and again["decided_by"] == ["grant:g-batch-db"]  # type: ignore[index]
        assert cli.json("apply")["applied"] == []  # type: ignore[index]

        st = cli.json("status")
        assert st["status"] == "up" and st["devices"]["nic:gpu1"]["bridge"] == "br-n0"  # type: ignore[index]
        assert st["applied"]["nic:gpu1"] and not st["missing_namespaces"]  # type: ignore[index]
        assert "leaf:leaf1" in cli("status").stdout

        _one_line_error(cli("probe", "acme/train/nobody", "globex/api/a1", "8443"), 1, "no workload")
        _one_line_error(cli("probe", "acme/train/w1", "globex/api/a1", "8443", "--ipv6"), 1, "no IPv6 address")
        assert cli("probe", "acme/train/w1", "globex/api/a1", "0").returncode == 2
        moved = fabric.read_text().replace("w1: {node: gpu1, port: pf0vf0", "w1: {node: gpu2, port: pf0vf2")
        fabric.write_text(moved)
        _one_line_error(cli("apply"), 1, "topology")
    finally:
        down = cli("down")
    assert down.returncode == 0 and "8 namespaces" in down.stdout
    assert netops.namespaces_with_prefix(build.names_for(Path(cli.env["TRUSTFABRIC_HOME"])).prefix) == []
    assert cli.json("status")["status"] == "down"  # type: ignore[index]


def test_bad_input_builds_nothing(cli: LabCli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMALL.read_text().replace("gpu2: {nic:", "gpu2: {nick:"))
    _one_line_error(cli("up", str(bad)), 1, "unknown field")
    two_leaves = tmp_path / "nospine.yaml"
    two_leaves.write_text("\n".join(line for line in SMALL.read_text().splitlines() if "spine1" not in line) + "\n")
    _one_line_error(cli("up", str(two_leaves)), 1, "no spine links")
    _one_line_error(cli("up", str(tmp_path / "missing.yaml")), 2, "missing.yaml")  # refused while parsing
    _one_line_error(cli("apply"), 1, "no lab is up")
    _one_line_error(cli("probe", "a/b/c", "d/e/f", "1"), 1, "no lab is up")
    _one_line_error(cli("up", str(SMALL), "--mode", "sideways"), 2, "'sideways' is not one of standalone, agent")
    assert netops.namespaces_with_prefix(build.names_for(Path(cli.env["TRUSTFABRIC_HOME"])).prefix) == []


def test_a_probe_says_when_a_grant_expired_since_the_last_apply(cli: LabCli, tmp_path: Path) -> None:
    """Standalone mode runs no reconciler: a grant's expiry takes effect at the next `lab apply`. The probe said
    OPEN 'decided by: grant:g-batch-db ... agrees with the wire' after the grant's expiry, nothing else (review);
    it now says the applied rule sets are stale and why, and `lab apply` closes the path."""
    fabric = tmp_path / "fabric.yaml"
    soon = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fabric.write_text(SMALL.read_text() + GRANT.replace("2099-01-01T00:00:00Z", soon))
    try:
        assert cli("up", str(fabric)).returncode == 0
        fresh = cli.json("probe", "globex/batch/b1", "acme/data/db1", "5432")
        assert fresh["result"] == "OPEN" and not fresh.get("stale")  # type: ignore[index,attr-defined]
        time.sleep(max(0.0, (datetime.fromisoformat(soon.replace("Z", "+00:00")) - datetime.now(UTC))
                       .total_seconds()) + 1.0)
        late = cli("probe", "globex/batch/b1", "acme/data/db1", "5432")
        assert late.returncode == 0 and "grant:g-batch-db" in late.stdout
        assert "stale: grant g-batch-db expired at" in late.stdout and "lab apply" in late.stdout, late.stdout
        assert cli("apply").returncode == 0
        closed = cli("probe", "globex/batch/b1", "acme/data/db1", "5432", "--timeout", "0.3", "--json")
        assert closed.returncode == 1 and json.loads(closed.stdout)["stale"] == [], closed.stdout
    finally:
        assert cli("down").returncode == 0
