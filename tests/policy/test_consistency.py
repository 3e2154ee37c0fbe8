"""A version whose `decision` (what explain shows) and `allowed_flows` (what the devices enforce) disagree is shown
by the impact report and refused at activation (policy/consistency.py), through the real app, CLI, regorus and
SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from typer.testing import CliRunner

from audit import Actor
from audit.models import AuditEvent
from cli.main import app as cli_app
from inventory import service as inv
from policy import service as policy_service
from policy.consistency import DIFF_CAP, diff_sample
from policy.decide import Flow
from policy.impact import checked_report
from tests.api.conftest import Env, activate_shipped_policy, make_settings, open_env, seed
from tests.console.conftest import sign_in, when_ready
from tests.policy.helpers import FAR_NS, NOW_NS, group, shipped, small_doc

PLATFORM_PORTS = "\tsome proto, ports in groups[dg].exposed\n\tports != []\n]\n\n# An unexpired"


def only_allowed_flows_edited() -> dict[str, str]:
    """The shipped policy with an extra platform port (9153, on each proto a platform group exposes) in
    allowed_flows, and nothing in decision."""
    mods = shipped()
    text = mods["flows.rego"]
    assert PLATFORM_PORTS in text
    mods["flows.rego"] = text.replace(PLATFORM_PORTS, "\tsome proto, exposed_ports in groups[dg].exposed\n"
                                      "\tports := array.concat(exposed_ports, [9153])\n\tports != []\n]\n\n"
                                      "# An unexpired")
    return mods


def only_decision_edited() -> dict[str, str]:
    """The shipped policy whose decision allows every exposed port of a group named `public` to anyone, a flow
    allowed_flows does not have (no grant, no rule)."""
    mods = shipped()
    mods["flows.rego"] += ('\nallow_reasons contains sprintf("public: %s is public", [label(dst)]) if {\n'
                           '\tdst.group == "public"\n\texposed\n}\n')
    return mods


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = open_env(make_settings(tmp_path / "home"))
    seed(e, policy=False)
    with e.ctx.db.session() as s:  # a platform service every tenant reaches
        actor = Actor.system("seed")
        inv.create_tenant(s, slug="platform", display_name="Platform", l3vni=1999, prefix="10.99.0.0/16",
                          actor=actor, clock=e.clock)
        inv.create_group(s, tenant="platform", name="dns", ports=[{"proto": "udp", "port": 53}], actor=actor,
                         clock=e.clock)
    yield e
    e.client.close()
    e.ctx.close()


def _cli(env: Env, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli_app, list(args), env={"TRUSTFABRIC_HOME": str(env.ctx.settings.home),
                                                          "TRUSTFABRIC_MODE": "development"})
    return result.exit_code, result.stdout, result.stderr


def _upload(env: Env, mods: dict[str, str]) -> int:
    r = env.call("POST", "/v1/policy/versions", "security", json={"modules": mods})
    assert r.status_code == 201 and r.json()["tests_passed"], r.text  # the Rego tests pass: only the check refuses
    return int(r.json()["number"])


def _activations(env: Env) -> list[Any]:
    with env.ctx.db.read_session() as s:
        return [e.object_id for e in s.exec(select(AuditEvent).where(col(AuditEvent.action) == "policy.activate"))]


def _refused(env: Env, number: int, active: int | None, flow_text: str) -> None:
    """Activation of `number` refused over HTTP and the CLI, naming `flow_text`; `active` still in force; no
    activation event for `number`."""
    r = env.call("POST", f"/v1/policy/versions/{number}/activate", "security", json={})
    assert r.status_code == 409, r.text
    assert "disagree" in r.json()["reason"] and flow_text in r.json()["reason"]
    code, out, err = _cli(env, "policy", "activate", str(number))
    assert code == 1 and err.startswith("error:") and flow_text in err and "Traceback" not in err + out
    got = env.call("GET", "/v1/policy/active", "auditor")
    assert (got.json()["number"] if got.status_code == 200 else None) == active
    assert str(number) not in _activations(env)


def test_shipped_policy_has_no_disagreements_and_activates(env: Env) -> None:
    number = _upload(env, shipped())
    imp = env.call("GET", f"/v1/policy/versions/{number}/impact", "security").json()
    assert imp["disagreements_count"] == 0 and imp["disagreements"] == []
    assert imp["consistency"]["checked"] >= imp["opened_count"] > 0  # a first version: everything opens
    code, out, _ = _cli(env, "policy", "impact", str(number), "--json")
    assert code == 0 and json.loads(out)["disagreements"] == []
    act = env.call("POST", f"/v1/policy/versions/{number}/activate", "security", json={})
    assert act.status_code == 200 and act.json()["state"] == "active", act.text
    assert _activations(env) == [str(number)]


def test_a_change_only_to_allowed_flows_is_shown_and_refused(env: Env) -> None:
    active = _upload(env, shipped())
    assert env.call("POST", f"/v1/policy/versions/{active}/activate", "security", json={}).status_code == 200
    number = _upload(env, only_allowed_flows_edited())
    imp = env.call("GET", f"/v1/policy/versions/{number}/impact", "security").json()
    assert imp["opened_count"] == 5  # acme/web, acme/db, globex/api, globex/vault, globex/public -> udp/9153
    assert imp["disagreements_count"] == 5
    first = imp["disagreements"][0]
    assert {k: first[k] for k in ("src_tenant", "src_group", "dst_tenant", "dst_group", "proto", "port")} == {
        "src_tenant": "acme", "src_group": "db", "dst_tenant": "platform", "dst_group": "dns", "proto": "udp",
        "port": 9153}
    assert first["allowed_flows"] == "allow" and first["decision"] == "deny"
    assert first["reasons"] == ["port-not-exposed: platform/dns does not expose udp/9153"]
    code, out, _ = _cli(env, "policy", "impact", str(number), "--json")
    assert code == 0 and json.loads(out)["disagreements"] == imp["disagreements"]
    code, out, err = _cli(env, "policy", "impact", str(number))
    assert code == 0 and "disagreement" in err and "9153" in out
    page = when_ready(env, sign_in(env, "security"), f"/console/policy/versions/{number}/impact")
    assert page.status_code == 200 and "decision and its allowed_flows disagree on 5 flows" in page.text
    assert ("<td>acme/db</td><td>platform/dns</td><td>udp/9153</td><td>allow</td><td>deny</td>"
            "<td>port-not-exposed: platform/dns does not expose udp/9153</td>") in page.text
    _refused(env, number, active, "acme/db -> platform/dns udp/9153")


def test_a_change_only_to_decision_is_shown_and_refused(env: Env) -> None:
    active = _upload(env, shipped())
    assert env.call("POST", f"/v1/policy/versions/{active}/activate", "security", json={}).status_code == 200
    number = _upload(env, only_decision_edited())
    imp = env.call("GET", f"/v1/policy/versions/{number}/impact", "security").json()
    assert imp["opened_count"] == 0 and imp["closed_count"] == 0  # the set is the same: found by the sample
    flows = {(d["src_tenant"], d["src_group"], d["dst_tenant"], d["dst_group"], d["proto"], d["port"])
             for d in imp["disagreements"]}
    assert ("acme", "web", "globex", "public", "tcp", 80) in flows
    assert all(d["allowed_flows"] == "deny" and d["decision"] == "allow" and d["reasons"] == ["public: "
               "globex/public is public"] for d in imp["disagreements"])
    _refused(env, number, active, "-> globex/public tcp/80")


def test_a_first_version_is_checked_too(env: Env) -> None:
    number = _upload(env, only_decision_edited())
    imp = env.call("GET", f"/v1/policy/versions/{number}/impact", "security").json()
    assert imp["baseline_hash"] is None and imp["disagreements_count"] > 0
    _refused(env, number, None, "-> globex/public tcp/80")


def test_rollback_to_a_version_in_force_before_is_not_blocked(env: Env) -> None:
    """A version that was in force (activated before this check existed: service.activate, as init does) stays
    a way back: the rollback is not refused, and its impact report still shows the disagreements."""
    actor = Actor.system("test")
    with env.ctx.db.session() as s:
        old, _ = policy_service.upload(s, only_allowed_flows_edited(), actor, now=env.clock())
        policy_service.activate(s, old.number or 0, actor, now=env.clock())
        old_number = old.number or 0
    newer = activate_shipped_policy(env)
    assert newer > old_number
    imp = env.call("GET", f"/v1/policy/versions/{old_number}/impact", "security").json()
    assert imp["disagreements_count"] > 0
    back = env.call("POST", f"/v1/policy/versions/{old_number}/rollback", "security", json={"reason": "incident"})
    assert back.status_code == 200 and back.json()["state"] == "active", back.text


def test_a_large_diff_is_sampled_over_every_port_it_touches() -> None:
    opened = [Flow(f"t{i:04d}", "g0", "platform", "dns", "tcp", port) for i in range(2000) for port in (53, 9153)]
    closed = [Flow("acme", "web", "globex", "api", "tcp", 8443)]
    picked = diff_sample(opened, closed)
    assert len(picked) == DIFF_CAP and closed[0] in picked
    assert {f.port for f in picked} == {53, 8443, 9153}
    assert len({f.src_tenant for f in picked}) >= DIFF_CAP // 4  # spread over the sources, not the first ones
    assert diff_sample(opened, closed) == picked  # deterministic
    assert diff_sample(opened[:10], closed) == opened[:10] + closed  # all of a small diff


def test_shipped_policy_agrees_on_every_flow_of_a_varied_inventory() -> None:
    """Quarantined tenant and group, a revoked group, an expired grant, a grant to a platform service: the
    shipped decision and allowed_flows agree on every allowed flow and on every pair over its ports."""
    data = small_doc()
    tf = data["tf"]
    tf["tenants"]["acme"]["groups"]["batch"]["quarantined"] = True
    tf["tenants"]["globex"]["groups"]["api"]["revoked"] = True
    tf["tenants"]["globex"]["groups"]["ui"] = group([("tcp", 3000)])
    tf["grants"].setdefault("globex", {}).setdefault("platform", {})["g4"] = {
        "src_group": "ui", "dst_group": "s3", "proto": "tcp", "ports": [9000], "expires_at_ns": FAR_NS}
    _, after, report = checked_report(shipped(), "c", None, None, [], data, NOW_NS)
    assert report.opened and report.consistency is not None
    assert report.consistency.diff_checked == report.consistency.diff_total == len(report.opened)
    assert report.consistency.checked > len(report.opened)  # the pairs outside the set too
    assert report.disagreements == []
    broken = only_allowed_flows_edited()
    _, _, bad = checked_report(broken, "b", shipped(), "c", after, data, NOW_NS)
    assert bad.disagreements and {d.flow for d in bad.disagreements} == set(bad.opened)
