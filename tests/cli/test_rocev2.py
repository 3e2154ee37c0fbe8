"""RoCEv2's symmetry in the CLI's human output, against the real data directory and the served API:
`policy impact` lists the RoCEv2 mirrors apart from the policy's flows, `grant show` (and request / approve,
which print the same) tells both sides a udp/4791 grant lets the destination's RoCEv2 reach the source, and
`policy explain` keeps the policy's DENY for the reverse but says the SuperNICs let it through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import Cli
from tests.policy.helpers import shipped


@pytest.fixture(scope="module")
def world(cli: Cli) -> dict[str, Any]:
    """acme/train and acme/data (RoCEv2 to data inside acme), globex/gpu (RoCEv2); tenant admins' tokens."""
    admin = cli.token("--role", "admin", "--ttl", "1h")
    for slug, vni in (("acme", "10001"), ("globex", "10002")):
        assert cli.run("tenant", "create", slug, "--display-name", slug.title(), "--l3vni", vni, "--prefix",
                       f"10.{vni[-1]}.0.0/16", token=admin).returncode == 0
    for tenant, group, port in (("acme", "train", "tcp/22"), ("acme", "data", "udp/4791"),
                                ("globex", "gpu", "udp/4791")):
        assert cli.run("group", "create", tenant, group, "--port", port, token=admin).returncode == 0
    return {"admin": admin, "acme": cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h"),
            "globex": cli.token("--role", "tenant-admin", "--tenant", "globex", "--ttl", "1h")}


def test_policy_impact_lists_the_rocev2_mirrors_apart(cli: Cli, world: dict[str, Any], tmp_path: Path) -> None:
    """A candidate without intra-tenant flows closes acme/train -> acme/data udp/4791, and on the wire its
    mirror acme/data -> acme/train too."""
    candidate = tmp_path / "no-intra"
    candidate.mkdir()
    for name, text in shipped().items():
        if name == "flows_test.rego":
            continue
        if name == "flows.rego":
            text = text.replace("array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)",
                                "array.concat(platform_flows, granted_flows)")
        (candidate / name).write_text(text)
    up = cli.json("policy", "upload", str(candidate))
    r = cli.run("policy", "impact", str(up["number"]))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("RoCEv2 mirrors on the wire (not policy flows): opened 0, closed 1 ") for line in lines)
    flows = r.stdout[r.stdout.index("flows closed"):r.stdout.index("RoCEv2 mirrors closed")]
    assert "acme/train" in flows and "4791" in flows
    mirrors = r.stdout[r.stdout.index("RoCEv2 mirrors closed (not policy flows)"):]
    assert [line.split() for line in mirrors.splitlines()[3:4]] == [
        ["acme/data", "acme/train", "udp", "4791", "acme/train", "->", "acme/data"]], mirrors
    as_json = cli.json("policy", "impact", str(up["number"]))
    assert as_json["mirrors_closed"] == [
        {"src_tenant": "acme", "src_group": "data", "dst_tenant": "acme", "dst_group": "train", "proto": "udp",
         "port": 4791, "mirror": "rocev2"}]


def test_policy_impact_says_when_a_policy_flow_does_not_change_the_wire(cli: Cli, world: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    """In force: acme/train -> acme/data udp/4791. A candidate allowing only acme/data -> acme/train udp/4791
    opens that (it passed already, as the mirror) and closes train -> data (it still passes, as the mirror)."""
    candidate = tmp_path / "swap"
    candidate.mkdir()
    old = "allowed_flows := array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)"
    for name, text in shipped().items():
        if name != "flows_test.rego":
            (candidate / name).write_text(text.replace(old, 'allowed_flows := [{"dst_tenant": "acme", '
                                                            '"dst_group": "train", "proto": "udp", "ports": [4791], '
                                                            '"reason": "r", "sources": ["acme/data"]}]'))
    up = cli.json("policy", "upload", str(candidate))
    r = cli.run("policy", "impact", str(up["number"]))
    assert r.returncode == 0, r.stderr
    assert "RoCEv2 mirrors" not in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if "4791" in line]
    assert ["acme/data", "acme/train", "udp", "4791", "passed", "already:", "RoCEv2", "mirror", "of", "the",
            "reverse"] in rows
    assert ["acme/train", "acme/data", "udp", "4791", "still", "passes:", "RoCEv2", "mirror", "of", "the",
            "reverse"] in rows
    assert ["acme/data", "acme/train", "tcp", "22", "-"] in [line.split() for line in r.stdout.splitlines()], r.stdout


GRANT_NOTE = ("  note: rocev2-mirror: udp/4791 is RoCEv2, symmetric on the SuperNICs: globex/gpu's RoCEv2 can also "
              "reach acme/train, with no grant of its own")


def test_grant_request_show_and_approve_carry_the_rocev2_note(cli: Cli, world: dict[str, Any]) -> None:
    asked = cli.run("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--proto", "udp",
                    "--port", "4791", "--ttl", "2h", token=world["acme"])
    assert asked.returncode == 0, asked.stderr
    lines = asked.stdout.splitlines()
    assert GRANT_NOTE in lines and lines[-1] == GRANT_NOTE  # after the policy's reasons
    gid = lines[0].split()[1].rstrip(":")
    shown = cli.run("grant", "show", gid, token=world["globex"])  # the approver
    assert GRANT_NOTE in shown.stdout.splitlines(), shown.stdout
    approved = cli.run("grant", "approve", gid, token=world["globex"])
    assert approved.returncode == 0 and f"grant {gid}: active" in approved.stdout
    assert GRANT_NOTE in approved.stdout.splitlines()
    revoked = cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"])
    assert revoked.returncode == 0 and "note:" not in revoked.stdout  # revoked: it opens nothing


def test_policy_explain_notes_the_rocev2_mirror_under_the_policy_s_deny(cli: Cli, world: dict[str, Any]) -> None:
    asked = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--proto", "udp",
                     "--port", "4791", "--ttl", "2h", token=world["acme"])
    gid = asked["id"]
    try:
        assert cli.json("grant", "approve", gid, token=world["globex"])["state"] == "active"
        r = cli.run("policy", "explain", "--src", "globex/gpu", "--dst", "acme/train", "--port", "4791",
                    "--proto", "udp")
        assert r.returncode == 1, r.stderr  # DENY (the policy's), whatever the wire does
        lines = r.stdout.splitlines()
        assert lines[0] == "DENY globex/gpu -> acme/train udp/4791"  # the policy's answer, as it was
        assert lines[-1] == (f"  note: rocev2-mirror: the SuperNICs let this RoCEv2 through anyway, as the mirror "
                             f"of acme/train -> globex/gpu udp/4791, which grant:{gid} allows (RoCEv2 skips "
                             "conntrack, so an allowance is symmetric)")
        as_json = cli.run("policy", "explain", "--src", "globex/gpu", "--dst", "acme/train", "--port", "4791",
                          "--proto", "udp", "--json")
        out = json.loads(as_json.stdout)
        assert as_json.returncode == 1 and out["allow"] is False and len(out["notes"]) == 1
        forward = cli.run("policy", "explain", "--src", "acme/train", "--dst", "globex/gpu", "--port", "4791",
                          "--proto", "udp")
        assert forward.returncode == 0 and forward.stdout.startswith("ALLOW") and "note:" not in forward.stdout
    finally:
        assert cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"]).returncode == 0


def test_policy_flows_lists_the_rocev2_mirrors_apart(cli: Cli, world: dict[str, Any]) -> None:
    """acme/train -> globex/gpu udp/4791 granted: `policy flows` from globex to acme has no policy flow and the
    RoCEv2 mirror in a table of its own; --json carries it as `mirrors`, the API's shape."""
    asked = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--proto", "udp",
                     "--port", "4791", "--ttl", "2h", token=world["acme"])
    gid = asked["id"]
    try:
        assert cli.json("grant", "approve", gid, token=world["globex"])["state"] == "active"
        r = cli.run("policy", "flows", "--src-tenant", "globex", "--dst-tenant", "acme")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("0 flows from globex to acme (policy ")
        assert lines[1].startswith("RoCEv2 mirrors on the wire (not policy flows): 1 (udp/4791 is symmetric")
        mirrors = r.stdout[r.stdout.index("RoCEv2 mirrors (not policy flows)"):]
        assert [line.split() for line in mirrors.splitlines()[3:4]] == [
            ["gpu", "train", "udp", "4791", "acme/train", "->", "globex/gpu"]], mirrors
        out = cli.json("policy", "flows", "--src-tenant", "globex", "--dst-tenant", "acme")
        assert out["total"] == 0 and out["items"] == [] and out["mirrors_total"] == 1
        assert out["mirrors"] == [{
            "src_tenant": "globex", "src_group": "gpu", "dst_tenant": "acme", "dst_group": "train", "proto": "udp",
            "port": 4791, "mirror": "rocev2", "notes": [
                f"rocev2-mirror: the SuperNICs let this RoCEv2 through anyway, as the mirror of acme/train -> "
                f"globex/gpu udp/4791, which grant:{gid} allows (RoCEv2 skips conntrack, so an allowance is "
                "symmetric)"]}]
        forward = cli.run("policy", "flows", "--src-tenant", "acme", "--dst-tenant", "globex")
        assert forward.returncode == 0 and "RoCEv2 mirrors" not in forward.stdout, forward.stdout
        assert [line.split()[:4] for line in forward.stdout.splitlines() if "4791" in line] == [
            ["train", "gpu", "udp", "4791"]], forward.stdout
        bad = cli.run("policy", "flows", "--src-tenant", "Not A Slug", "--dst-tenant", "acme")
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
    finally:
        assert cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"]).returncode == 0


def test_a_port_is_taken_as_the_cli_prints_it(cli: Cli, world: dict[str, Any]) -> None:
    """`udp/4791`, as groups, grants and the RoCEv2 note print it, is taken by `grant explain|request` and
    `policy explain` as `--proto udp --port 4791`; a protocol that disagrees is a usage error in one line."""
    split = cli.json("grant", "explain", "--src-group", "train", "--dst", "globex/gpu", "--proto", "udp",
                     "--port", "4791", token=world["acme"])
    joined = cli.json("grant", "explain", "--src-group", "train", "--dst", "globex/gpu", "--port", "udp/4791",
                      token=world["acme"])
    assert joined == split and joined["input"]["proto"] == "udp"
    asked = cli.run("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--port", "udp/4791",
                    "--ttl", "1h", token=world["acme"])
    assert asked.returncode == 0, asked.stderr
    assert " acme/train -> globex/gpu udp/4791 for 1h" in asked.stdout.splitlines()[1] + " "
    gid = asked.stdout.split()[1].rstrip(":")
    try:
        r = cli.run("policy", "explain", "--src", "acme/train", "--dst", "globex/gpu", "--port", "udp/4791")
        assert r.returncode == 1 and r.stdout.startswith("DENY acme/train -> globex/gpu udp/4791\n"), r.stderr
        assert "udp/4791" in r.stdout.splitlines()[1]  # the policy was asked about udp, not tcp
        same = cli.run("policy", "explain", "--src", "acme/train", "--dst", "globex/gpu", "--port", "udp/4791",
                       "--proto", "udp")
        assert same.stdout == r.stdout
    finally:
        assert cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"]).returncode == 0
    commands: list[tuple[str, ...]] = [("grant", "explain", "--src-group", "train", "--dst", "globex/gpu"),
                                       ("grant", "request", "--src-group", "train", "--dst", "globex/gpu"),
                                       ("policy", "explain", "--src", "acme/train", "--dst", "globex/gpu")]
    for command in commands:
        for ports in (("--port", "udp/4791", "--proto", "tcp"), ("--port", "udp/4791", "--port", "tcp/22"),
                      ("--port", "icmp/8")):
            if command[0] == "policy" and ports.count("--port") > 1:
                continue  # one port there
            bad = cli.run(*command, *ports, token=world["acme"])
            assert bad.returncode == 2 and bad.stdout == "", (command, ports, bad.stdout)
            assert bad.stderr.startswith("error: Invalid value for '--port'") and bad.stderr.count("\n") == 1
            assert "Traceback" not in bad.stderr


def test_grant_list_says_an_approved_grant_was_approved(cli: Cli, world: dict[str, Any]) -> None:
    """Its `why` is who approved it, not the request's `approval-needed: ...`, which reads as still waiting."""
    asked: Any = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--port", "udp/4791",
                          "--ttl", "1h", token=world["acme"])
    gid = asked["id"]
    try:
        assert cli.json("grant", "approve", gid, token=world["globex"])["state"] == "active"
        r = cli.run("grant", "list", "--state", "active", token=world["acme"], COLUMNS="200")
        assert r.returncode == 0, r.stderr
        row = next(line for line in r.stdout.splitlines() if line.startswith(gid))
        assert "approved as tenant-admin:globex by " in row and "approval-needed" not in row, row
    finally:
        assert cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"]).returncode == 0


def test_grant_show_of_a_decided_grant_tells_its_approval_as_history(cli: Cli, world: dict[str, Any]) -> None:
    """Pending, the request's `approval-needed` is current (with `waiting for`); approved, it is history: what was
    needed, who gave it and when -- never `reason: approval-needed: ...` beside `active`, which reads as waiting."""
    def show(gid: str) -> list[str]:
        r = cli.run("grant", "show", gid, token=world["acme"], COLUMNS="200")
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    asked: Any = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--port", "udp/4791",
                          "--ttl", "1h", token=world["acme"])
    gid = asked["id"]
    try:
        pending = show(gid)
        assert "  reason: approval-needed: tenant-admin:globex" in pending
        assert any(line.startswith("  waiting for: tenant-admin:globex") for line in pending), pending
        assert cli.run("grant", "approve", gid, "--comment", "ok for the run", token=world["globex"]).returncode == 0
        active = show(gid)
        assert active[0] == f"grant {gid}: active"
        assert not any("approval-needed" in line or "waiting" in line for line in active), active
        (history,) = [line for line in active if line.startswith("  approval needed at request: ")]
        assert history.startswith("  approval needed at request: tenant-admin:globex; approved as "
                                  "tenant-admin:globex by "), history
        assert history.endswith(" (ok for the run)") and " at " in history, history
    finally:
        assert cli.run("grant", "revoke", gid, "--reason", "done", token=world["acme"]).returncode == 0
    revoked = show(gid)
    assert "  reason: revoked: done" in revoked and not any("approval-needed" in line for line in revoked)
    listed = cli.run("grant", "list", "--state", "revoked", token=world["acme"], COLUMNS="200")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(gid))
    assert row.rstrip().endswith("revoked: done") and "approval-needed" not in row, row  # grant list's why too
    assert any(line.startswith("  approval needed at request: tenant-admin:globex; approved as ") for line in revoked)
    rejected: Any = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/gpu", "--port", "udp/4791",
                             "--ttl", "2h", token=world["acme"])
    assert cli.run("grant", "reject", rejected["id"], "--reason", "not now", token=world["globex"]).returncode == 0
    lines = show(rejected["id"])
    assert "  approval needed at request: tenant-admin:globex; never given" in lines
    assert "  reason: rejected: not now" in lines
