"""The installed `trustfabric` binary, once per command group (everything else runs in-process): init and
serve make and serve a data directory; token, whoami, tenant, group, workload, grant, fabric, device and
enforcer status go through that server; svid, bundle, ca, node, policy, audit, enforcer compile and lab work on the
data directory beside it. (`pdp` runs as a
binary in tests/policy/test_routes_cli.py.) And `--help` loads neither FastAPI nor a database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.policy.conftest import free_port
from tests.servers import serve_binary

BIN = str(Path(sys.executable).parent / "trustfabric")
pytestmark = pytest.mark.xdist_group("cli-smoke")


class Binary:
    def __init__(self, base: Path, port: int) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
        self.env.update({"TRUSTFABRIC_HOME": str(base / "home"), "TRUSTFABRIC_SERVER": f"http://127.0.0.1:{port}",
                         "TRUSTFABRIC_CONFIG": str(base / "none.json"), "COLUMNS": "200",
                         "TRUSTFABRIC_MODE": "development"})
        self.base = base

    def run(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, **({"TRUSTFABRIC_TOKEN": token} if token else {}))
        return subprocess.run([BIN, *args], env=env, cwd=self.base, capture_output=True, text=True, timeout=60)

    def json(self, *args: str, token: str | None = None) -> Any:
        """The command's --json output, parsed (as a response's .json(): whatever JSON the command printed)."""
        r = self.run(*args, "--json", token=token)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return json.loads(r.stdout)


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Binary]:
    base = tmp_path_factory.mktemp("smoke")
    port = free_port()
    b = Binary(base, port)
    init = b.run("init", "--trust-domain", "example.org")
    assert init.returncode == 0 and "initialised trust domain spiffe://example.org" in init.stdout, init.stderr
    with serve_binary([BIN, "serve", "--port", str(port), "--log-level", "warning"], port=port, env=b.env, cwd=base):
        yield b


def test_every_command_group_runs_as_the_installed_binary(binary: Binary) -> None:
    admin = binary.run("token", "create", "--role", "admin", "--ttl", "1h").stdout.strip().splitlines()[-1]
    who = binary.json("whoami", token=admin)
    assert isinstance(who, dict) and (who["role"], who["tenant"], who["auth"]) == ("admin", None, "jwt")
    assert binary.json("tenant", "create", "acme", "--display-name", "Acme", token=admin)["slug"] == "acme"
    assert binary.json("group", "create", "acme", "web", "--port", "tcp/443", token=admin)["name"] == "web"
    w = binary.json("workload", "register", "acme", "web", "w1", token=admin)
    assert w["spiffe_id"] == "spiffe://example.org/tenant/acme/group/web/w1"
    assert binary.json("grant", "list", token=admin) == []
    fab = binary.base / "fabric.yaml"
    fab.write_text("trust_domain: example.org\nnodes: {n1: {nic: {uplinks: [p0], host_ports: [vf0]}}}\n"
                   "leaves: {l1: {ports: [swp1]}}\nlinks: [[l1:swp1, n1:p0]]\n"
                   "placements: {acme/web/w1: {node: n1, port: vf0, ipv4: 10.0.0.5}}\n")
    imported = binary.json("fabric", "import", str(fab), token=admin)
    assert imported["changes"]["placements"]["added"]["count"] == 1
    assert binary.run("enforcer", "compile").returncode == 0  # publishes, unless the server's reconciler did first
    devices = binary.json("enforcer", "status", token=admin)
    assert {(d["device"], d["desired_version"]) for d in devices} == {("nic:n1", 1), ("leaf:l1", 1)}
    assert binary.json("device", "show", "nic:n1", token=admin)["desired_version"] == 1
    jwt = binary.run("svid", "jwt", "--tenant", "acme", "--group", "web", "--workload", "w1", "--audience", "a")
    assert jwt.returncode == 0 and jwt.stdout.count(".") == 2, jwt.stderr
    assert binary.json("bundle", "show")["spiffe_sequence"] == 1
    assert binary.json("ca", "status")["active_generation"] == 1
    assert str(binary.json("node", "token", "create", "--node", "n1")["token"]).startswith("tfjt_")
    assert [v["state"] for v in binary.json("policy", "list")] == ["active"]
    key = binary.run("audit", "public-key")
    assert key.returncode == 0 and key.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    assert binary.json("lab", "status")["status"] == "down"
    bad = binary.run("grant", "request", "--dst", "globex", token=admin)
    assert bad.returncode == 2  # usage
    missing = binary.run("tenant", "list", token="tfo_nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr


def test_help_loads_neither_fastapi_nor_a_database() -> None:
    code = ("import sys\nfrom cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('fastapi', 'sqlalchemy', 'sqlmodel', 'httpx', 'regorus', 'uvicorn') "
            "if m in sys.modules)\nprint('LOADED', heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert "Usage: trustfabric" in r.stdout and "LOADED []" in r.stdout, r.stdout[-300:]
