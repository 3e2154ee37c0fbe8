"""The CLI end to end against a real `trustfabric serve` process: tokens minted locally, every other
command through the API; --json output, exit codes 0/1/2, one readable error line, config file mode."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.xdist_group("cli")

BIN = str(Path(sys.executable).parent / "trustfabric")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cli:
    def __init__(self, home: Path, server: str, cwd: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TRUSTFABRIC_")}
        self.env.update({"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_SERVER": server,
                         "TRUSTFABRIC_CONFIG": str(cwd / "no-config.json"), "COLUMNS": "200"})
        self.cwd = cwd

    def run(self, *args: str, token: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        e = dict(self.env, **env)
        if token:
            e["TRUSTFABRIC_TOKEN"] = token
        return subprocess.run([BIN, *args], env=e, cwd=self.cwd, capture_output=True, text=True, timeout=60)

    def json(self, *args: str, token: str | None = None) -> object:
        r = self.run(*args, "--json", token=token)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return json.loads(r.stdout)

    def token(self, *args: str) -> str:
        r = self.run("token", "create", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    base = tmp_path_factory.mktemp("cli")
    port = free_port()
    c = Cli(base / "home", f"http://127.0.0.1:{port}", base)
    init = c.run("init", "--trust-domain", "example.org")
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen([BIN, "serve", "--port", str(port), "--log-level", "warning"], env=c.env, cwd=base,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{c.env['TRUSTFABRIC_SERVER']}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.1)
        yield c
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_init_activates_the_shipped_policy_once(cli: Cli) -> None:
    versions = cli.json("policy", "list")
    assert [(v["number"], v["state"]) for v in versions] == [(1, "active")]  # type: ignore[index,union-attr]
    again = cli.run("init", "--trust-domain", "example.org")
    assert again.returncode == 0 and "nothing changed" in again.stdout and "policy version" not in again.stdout
    assert len(cli.json("policy", "list")) == 1  # type: ignore[arg-type]


def test_token_create_prints_the_token_last_and_whoami(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    assert admin.count(".") == 2
    who = cli.json("whoami", token=admin)
    assert isinstance(who, dict) and (who["role"], who["tenant"], who["auth"]) == ("admin", None, "jwt")
    r = cli.run("token", "create", "--role", "tenant-admin", "--ttl", "1h")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_grant_flow_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    for slug in ("acme", "globex"):
        assert cli.run("tenant", "create", slug, "--display-name", slug.title(), token=admin).returncode == 0
    assert cli.run("group", "create", "acme", "web", "--port", "tcp/443", token=admin).returncode == 0
    assert cli.run("group", "create", "globex", "api", "--port", "tcp/443", token=admin).returncode == 0
    acme = cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")
    globex = cli.token("--role", "tenant-admin", "--tenant", "globex", "--ttl", "1h")

    g = cli.json("grant", "request", "--src-group", "web", "--dst", "globex/api", "--port", "443", "--ttl", "2h",
                 token=acme)
    assert g["state"] == "pending" and g["pending_approvers"] == ["tenant-admin:globex"]  # type: ignore[index]
    gid = g["id"]  # type: ignore[index]
    denied = cli.run("grant", "request", "--src-group", "web", "--dst", "globex/api", "--port", "22", token=acme)
    assert denied.returncode == 1 and "port-not-exposed" in denied.stdout
    own = cli.run("grant", "approve", gid, token=acme)
    assert own.returncode == 1 and "own grant request" in own.stderr and "Traceback" not in own.stderr
    assert cli.json("grant", "approve", gid, token=globex)["state"] == "active"  # type: ignore[index]
    # the shipped policy (activated by init) now lets the flow through, and says why
    flow = cli.json("policy", "explain", "--src", "acme/web", "--dst", "globex/api", "--port", "443")
    assert flow["allow"] is True and any("grant" in r for r in flow["reasons"]), flow  # type: ignore[index]
    listed = cli.json("grant", "list", "--state", "active", token=globex)
    assert [x["id"] for x in listed] == [gid]  # type: ignore[union-attr,index]
    assert cli.json("grant", "revoke", gid, "--reason", "done", token=acme)["state"] == "revoked"  # type: ignore[index]
    human = cli.run("grant", "show", gid, token=acme)
    assert human.returncode == 0 and f"grant {gid}: revoked" in human.stdout

    r = cli.run("tenant", "quarantine", "globex", "--reason", "incident", token=acme)
    assert r.returncode == 1 and "HTTP 403" in r.stderr
    security = cli.token("--role", "security", "--ttl", "1h")
    assert cli.json("tenant", "quarantine", "globex", "--reason", "incident", token=security)[
        "quarantined"] is True  # type: ignore[index]
    assert cli.json("workload", "register", "acme", "web", "web-1", token=acme)[  # type: ignore[index]
        "spiffe_id"] == "spiffe://example.org/tenant/acme/group/web/web-1"
    revoked = cli.json("workload", "revoke", "acme", "web", "web-1", "--reason", "compromised", token=security)
    assert revoked["workload"]["revoked"] is True  # type: ignore[index]
    # a usage error is exit 2
    assert cli.run("grant", "request", "--dst", "globex", token=acme).returncode == 2

    # the token from a config file: refused when others can read it, used when it is 0600
    conf = tmp_path / "config.json"
    conf.write_text(json.dumps({"token": acme}))
    conf.chmod(0o644)
    r = cli.run("whoami", TRUSTFABRIC_CONFIG=str(conf))
    assert r.returncode == 1 and "chmod 600" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    conf.chmod(0o600)
    r = cli.run("whoami", "--json", TRUSTFABRIC_CONFIG=str(conf))
    assert r.returncode == 0 and json.loads(r.stdout)["tenant"] == "acme"

    # a revoked token is refused from the next request on
    tok = json.loads(cli.run("token", "create", "--role", "auditor", "--ttl", "1h", "--json").stdout)
    assert cli.run("whoami", token=tok["token"]).returncode == 0
    assert cli.run("token", "revoke", tok["id"], "--reason", "test").returncode == 0
    r = cli.run("whoami", token=tok["token"])
    assert r.returncode == 1 and "revoked" in r.stderr

    r = cli.run("whoami", "--server", "http://127.0.0.1:1", token=acme)
    assert r.returncode == 1 and "cannot reach" in r.stderr
