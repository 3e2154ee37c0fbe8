"""The CLI end to end against the real API (served over the same data directory): tokens minted locally,
every other command through the API; --json output, exit codes 0/1/2, one readable error line, config
file mode. In-process (tests/cli/conftest.py); the binary itself is exercised by test_smoke.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli


def test_init_activates_the_shipped_policy_once(cli: Cli) -> None:
    versions = cli.json("policy", "list")
    assert [(v["number"], v["state"]) for v in versions] == [(1, "active")]
    again = cli.run("init", "--trust-domain", "example.org")
    assert again.returncode == 0 and "nothing changed" in again.stdout and "policy version" not in again.stdout
    assert len(cli.json("policy", "list")) == 1


def test_token_create_prints_the_token_last_and_whoami(cli: Cli) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    assert admin.count(".") == 2
    who = cli.json("whoami", token=admin)
    assert isinstance(who, dict) and (who["role"], who["tenant"], who["auth"]) == ("admin", None, "jwt")
    r = cli.run("token", "create", "--role", "tenant-admin", "--ttl", "1h")  # no --tenant: usage
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
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
    assert g["state"] == "pending" and g["pending_approvers"] == ["tenant-admin:globex"]
    gid = g["id"]
    denied = cli.run("grant", "request", "--src-group", "web", "--dst", "globex/api", "--port", "22", token=acme)
    assert denied.returncode == 1 and "port-not-exposed" in denied.stdout
    own = cli.run("grant", "approve", gid, token=acme)
    assert own.returncode == 1 and "own grant request" in own.stderr and "Traceback" not in own.stderr
    assert cli.json("grant", "approve", gid, token=globex)["state"] == "active"
    # the shipped policy (activated by init) now lets the flow through, and says why
    flow = cli.json("policy", "explain", "--src", "acme/web", "--dst", "globex/api", "--port", "443")
    assert flow["allow"] is True and any("grant" in r for r in flow["reasons"]), flow
    listed = cli.json("grant", "list", "--state", "active", token=globex)
    assert [x["id"] for x in listed] == [gid]
    assert cli.json("grant", "revoke", gid, "--reason", "done", token=acme)["state"] == "revoked"
    human = cli.run("grant", "show", gid, token=acme)
    assert human.returncode == 0 and f"grant {gid}: revoked" in human.stdout
    assert f"requested by {g['requested_by']}@acme at" in human.stdout  # whose id: acme's

    r = cli.run("tenant", "quarantine", "globex", "--reason", "incident", token=acme)
    assert r.returncode == 1 and "HTTP 403" in r.stderr
    security = cli.token("--role", "security", "--ttl", "1h")
    assert cli.json("tenant", "quarantine", "globex", "--reason", "incident", token=security)[
        "quarantined"] is True
    assert cli.json("workload", "register", "acme", "web", "web-1", token=acme)[
        "spiffe_id"] == "spiffe://example.org/tenant/acme/group/web/web-1"
    revoked = cli.json("workload", "revoke", "acme", "web", "web-1", "--reason", "compromised", token=security)
    assert revoked["workload"]["revoked"] is True
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


def test_a_workload_is_named_as_place_names_it_or_in_three_words(cli: Cli) -> None:
    """`workload place|unplace` and the grant options name a workload acme/train/w1; register, show and revoke took
    only `acme train w1`, and refused the other form as "not a DNS label". Both forms work on all of them, the
    same; half of one or a mix is a usage error naming both forms."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    assert cli.run("tenant", "create", "wlco", "--display-name", "Wl", token=admin).returncode == 0
    assert cli.run("group", "create", "wlco", "train", "--port", "tcp/443", token=admin).returncode == 0
    made = cli.json("workload", "register", "wlco/train/w1", token=admin)
    assert made["spiffe_id"].endswith("/tenant/wlco/group/train/w1"), made
    assert cli.json("workload", "show", "wlco/train/w1", token=admin) == cli.json(
        "workload", "show", "wlco", "train", "w1", token=admin) == made
    for argv in (("wlco", "train"), ("wlco",), ("wlco/train/w1", "train"), ("wlco/train",)):
        r = cli.run("workload", "show", *argv, token=admin)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "TENANT/GROUP/NAME" in r.stderr, (argv, r.stderr)
    revoked = cli.json("workload", "revoke", "wlco/train/w1", "--reason", "test", token=admin)
    assert revoked and cli.json("workload", "show", "wlco", "train", "w1", token=admin)["revoked"] is True
