"""`trustfabric fabric ...` (through the API), `workload place` and `trustfabric enforcer ...` (on the data
directory; `status` through the API), in-process: the README's fabric tour, --json, exit codes, one line on
error. tests/cli/test_smoke.py runs both groups as the installed binary once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.cli.conftest import Cli
from tests.cli.test_views import ISO_UTC, REPRS
from tests.enforcer.helpers import ROOT, SMALL

TRAIN_TO_API = {"nic:gpu1", "nic:gpu3", "leaf:leaf1", "leaf:leaf2"}


def one_error_line(r: Any, *needles: str, code: int = 1) -> None:
    assert r.returncode == code, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_the_fabric_and_enforcer_tour(cli: Cli, tmp_path: Path) -> None:
    admin = cli.token("--role", "admin", "--ttl", "1h")
    imported = cli.run("fabric", "import", str(SMALL), token=admin)
    assert imported.returncode == 0, imported.stderr
    assert "placements: added 6" in imported.stdout and "not imported: 1 grant(s) (g-train-api)" in imported.stdout
    assert cli.json("fabric", "import", str(SMALL), token=admin)["unchanged"] is True
    nodes = cli.json("fabric", "node", "list", token=admin)
    assert [n["name"] for n in nodes] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    links = cli.json("fabric", "link", "list", token=admin)
    assert len(links) == 6 and {"leaf": "leaf1:swp1", "peer": "gpu1:p0"} in links
    gpu1 = cli.json("fabric", "node", "show", "gpu1", token=admin)
    assert gpu1["links"] == ["p0->leaf1:swp1"] and gpu1["uplinks"] == ["p0"]
    leaf1 = cli.json("fabric", "leaf", "show", "leaf1", token=admin)
    assert leaf1["model"] == "sn5600" and "swp1->gpu1:p0" in leaf1["links"]
    one_error_line(cli.run("fabric", "spine", "show", "spine9", token=admin), "no spine 'spine9'")
    one_error_line(cli.run("fabric", "link", "add", "leaf1:swp9", "gpu4:p0", token=admin),
                   "leaf leaf1 has no port 'swp9'", "HTTP 400")
    one_error_line(cli.run("workload", "place", "acme/train/w1", "--node", "gpu1", "--port", "pf0vf2", "--ipv4",
                           "10.2.0.1", token=admin), "10.2.0.1 is outside tenant acme's prefixes")
    placed = cli.run("workload", "place", "acme/train/w1", "--node", "gpu1", "--port", "pf0vf0", "--ipv4",
                     "10.1.0.11", "--ipv6", "fd00:1::11", "--selector", "unix:uid:1001", token=admin)
    assert placed.returncode == 0 and "placements: changed 1" in placed.stdout, placed.stderr
    placed_on = cli.json("fabric", "placement", "list", "--node", "gpu1", token=admin)
    assert {p["workload"]: p["selectors"] for p in placed_on}["acme/train/w1"] == ["unix:uid:1001"]
    assert cli.json("fabric", "placement", "show", "acme/train/w1", token=admin)["node"] == "gpu1"
    acme = cli.token("--role", "tenant-admin", "--tenant", "acme", "--ttl", "1h")
    one_error_line(cli.run("fabric", "node", "list", token=acme), "HTTP 403")

    first = cli.json("enforcer", "compile")
    assert first["full"] and sorted(first["published"]) == sorted(
        {"nic:gpu1", "nic:gpu2", "nic:gpu3", "nic:gpu4", "leaf:leaf1", "leaf:leaf2"})
    flows = cli.run("enforcer", "show", "--device", "nic:gpu1", "--format", "openflow")
    assert flows.returncode == 0 and "dl_vlan=101" in flows.stdout
    assert "ct(commit,zone=NXM_NX_REG6[0..15])" in flows.stdout
    nv = cli.run("enforcer", "show", "--device", "leaf:leaf1", "--format", "nv-set")
    assert nv.returncode == 0 and "nv set vrf vrf10001" in nv.stdout
    one_error_line(cli.run("enforcer", "show", "--device", "nic:gpu1", "--format", "nvue"), "is a SuperNIC", code=2)
    nft = cli.json("enforcer", "show", "--device", "leaf:leaf2", "--format", "nft")
    assert nft["version"] == 1 and '"table"' in nft["text"] and "ip_rules" in nft["text"]
    ir = cli.json("enforcer", "show", "--device", "nic:gpu3", "--format", "ir")
    assert json.loads(ir["text"])["device"] == "nic:gpu3"
    assert cli.run("enforcer", "show", "--device", "nic:gpu3", "--format", "pdf").returncode == 2
    one_error_line(cli.run("enforcer", "show", "--device", "nic:gpu9"), "nic:gpu9 has no published rule set")
    status = cli.json("enforcer", "status", token=admin)
    assert {r["device"]: r["desired_version"] for r in status} == dict.fromkeys(first["published"], 1)
    assert cli.json("device", "list", token=admin) == status
    assert cli.json("device", "show", "nic:gpu1", token=admin) == next(r for r in status if r["device"] == "nic:gpu1")
    ruleset = cli.json("device", "ruleset", "leaf:leaf1", token=admin)
    assert ruleset["version"] == 1 and ruleset["ir"]["device"] == "leaf:leaf1"
    one_error_line(cli.run("device", "show", "nic:gpu9", token=admin), "nic:gpu9 has no published rule set")

    globex = cli.token("--role", "tenant-admin", "--tenant", "globex", "--ttl", "1h")
    g = cli.json("grant", "request", "--src-group", "train", "--dst", "globex/api", "--port", "8443", token=acme)
    assert cli.json("grant", "approve", g["id"], token=globex)["state"] == "active"
    plan = cli.json("enforcer", "plan")
    assert {p["device"] for p in plan} == TRAIN_TO_API
    human = cli.run("enforcer", "plan")
    assert human.returncode == 0 and "nic:gpu1" in human.stdout and "nic:gpu2" not in human.stdout
    second = cli.json("enforcer", "compile")
    assert second["published"] == dict.fromkeys(TRAIN_TO_API, 2)

    back = cli.json("enforcer", "rollback", "--device", "nic:gpu1", "--to", "1", "--reason", "bad push")
    assert back["version"] == 3 and back["pinned"] is True
    # gpu1, pinned to the set from before the grant, denies what the policy now allows: `verify` answers no, and
    # the mismatches are its answer, on stdout as a table and in --json (they were printed on stderr)
    mismatched = cli.run("enforcer", "verify")
    assert mismatched.returncode == 1 and mismatched.stderr == "", mismatched.stderr
    assert "mismatches" in mismatched.stdout and "acme/train/" in mismatched.stdout, mismatched.stdout
    assert "globex/api/" in mismatched.stdout and "tcp/8443" in mismatched.stdout, mismatched.stdout
    assert mismatched.stdout.rstrip().splitlines()[-1].startswith("not ok: 0 device(s) not verifiable, "), (
        mismatched.stdout)
    as_json = cli.run("enforcer", "verify", "--json")
    assert as_json.returncode == 1 and as_json.stderr == "", as_json.stderr
    verdict = json.loads(as_json.stdout)
    assert verdict["ok"] is False and verdict["findings"] == [] and verdict["mismatches"], verdict
    assert {(m["policy"], m["devices"], m["port"]) for m in verdict["mismatches"]} == {("allow", "deny", 8443)}
    one_error_line(cli.run("enforcer", "rollback", "--device", "nic:gpu1", "--to", "9"), "earlier version")
    applied = cli.json("enforcer", "apply", "--device", "nic:gpu1")
    assert applied["published"] == {"nic:gpu1": 4}
    unknown = cli.run("enforcer", "apply", "--device", "nic:gpu99")  # no such device: said, not "up to date" (exit 0)
    assert unknown.returncode == 1 and "nic:gpu99 is not a device of the fabric" in unknown.stderr, unknown.stderr
    assert unknown.stderr.count("\n") == 1 and unknown.stdout == ""
    versions = cli.json("enforcer", "versions", "--device", "nic:gpu1")
    assert [v["version"] for v in versions] == [4, 3, 2, 1]
    assert versions[1]["content_hash"] == versions[3]["content_hash"]  # the rollback
    # the same list away from the server host (an auditor's, a platform admin's machine): `device versions`
    over_api = cli.json("device", "versions", "nic:gpu1", token=admin)
    assert over_api == [{k: v for k, v in row.items() if k != "device"} for row in versions], over_api
    ok = cli.run("enforcer", "verify")
    assert ok.returncode == 0 and "ok:" in ok.stdout, ok.stderr

    candidate = tmp_path / "rego"
    candidate.mkdir()
    for f in (ROOT / "rego").glob("*.rego"):
        text = f.read_text()
        if f.name == "flows.rego":
            text = text.replace("array.concat(array.concat(intra_tenant_flows, platform_flows), granted_flows)",
                                "array.concat(intra_tenant_flows, granted_flows)")
        (candidate / f.name).write_text(text)
    uploaded = cli.run("policy", "upload", str(candidate))  # its flows tests fail: stored, not activatable
    assert uploaded.returncode == 1 and "version 2 uploaded" in uploaded.stdout, uploaded.stderr
    staged = cli.json("enforcer", "plan", "--staged", "2")
    assert staged and all(p["rules_removed"] > 0 for p in staged)
    impact = cli.json("policy", "impact", "2")
    assert impact["devices"]["touched"] == len(staged)
    table = cli.run("policy", "impact", "2")
    assert table.returncode == 0 and f"devices: {len(staged)} of 6 would change" in table.stdout
    human_output_reads_well(cli, admin)

    # `enforcer verify` answers no (exit 1, naming why) when a device of the fabric has no published rule set yet;
    # with no data directory it fails (1) too: only a wrong command line is 2
    assert cli.run("fabric", "node", "add", "gpu9", "--uplink", "p0", token=admin).returncode == 0
    unpublished = cli.run("enforcer", "verify")
    assert unpublished.returncode == 1 and unpublished.stderr == "", unpublished.stderr
    assert "nic:gpu9" in unpublished.stdout and "no published rule set" in unpublished.stdout, unpublished.stdout
    nothing = cli.run("enforcer", "verify", TRUSTFABRIC_HOME=str(tmp_path / "nothing"))
    assert nothing.returncode == 1 and "does not exist" in nothing.stderr, nothing.stderr  # a failure, not usage


def human_output_reads_well(cli: Cli, admin: str) -> None:
    """Every fabric, device and enforcer list/show for people: no Python repr, times local, ids whole at 80
    columns; yaml is the same data as --json."""
    for argv in (["fabric", "node", "list"], ["fabric", "node", "show", "gpu1"], ["fabric", "leaf", "list"],
                 ["fabric", "spine", "show", "spine1"], ["fabric", "link", "list"], ["fabric", "placement", "list"],
                 ["fabric", "placement", "show", "acme/train/w1"], ["device", "list"], ["device", "show", "nic:gpu1"],
                 ["device", "ruleset", "nic:gpu1"], ["device", "versions", "nic:gpu1"], ["enforcer", "status"],
                 ["enforcer", "plan", "--staged", "2"],
                 ["enforcer", "versions", "--device", "nic:gpu1"], ["tenant", "show", "acme"]):
        r = cli.run(*argv, token=admin, COLUMNS="80")
        assert r.returncode == 0 and r.stdout.strip(), (argv, r.stderr)
        found = REPRS.search(r.stdout)
        assert found is None, (argv, found.group(0), r.stdout)
        assert ISO_UTC.search(r.stdout) is None, (argv, "times are shown in local form", r.stdout)
        assert max(len(line) for line in r.stdout.splitlines()) <= 80, (argv, r.stdout)
        if argv[0] != "enforcer" or argv[1] in ("status", "versions"):
            as_yaml = yaml.safe_load(cli.run(*argv, "-o", "yaml", token=admin).stdout)
            assert as_yaml == cli.json(*argv, token=admin), argv
    listed = cli.run("device", "list", token=admin, COLUMNS="80").stdout
    for device in ("nic:gpu1", "nic:gpu2", "nic:gpu3", "nic:gpu4", "leaf:leaf1", "leaf:leaf2"):
        assert device in listed, listed


def test_show_offers_every_format_the_renderers_have() -> None:
    from cli.local.enforcer import FORMATS
    from workflows.enforcement import FORMATS as RENDERED

    assert sorted(FORMATS) == sorted(RENDERED)
