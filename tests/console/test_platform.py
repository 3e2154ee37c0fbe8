"""The Platform page and a device's detail, on the golden fabric with every device published and a few agent
reports: exactly what the device API answers (versions, drift, last apply, counters, the rule set and its
history), the per-device section of a version's impact, and in a real browser (screenshots)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Env
from tests.api.test_devices import approve_grant_over_the_api, fabric_env
from tests.api.test_impact_cache import candidate
from tests.console.conftest import serving, sign_in
from tests.console.test_browser import Shots, signed_in_page

pytestmark = pytest.mark.xdist_group("devices")


@pytest.fixture(scope="module")
def fenv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The golden fabric; nic:gpu1 republished after a grant; its agent in sync with counters, nic:gpu2's
    agent reporting drift it repaired, leaf:leaf1's an error; the others never reported."""
    env = fabric_env(Path(tmp_path_factory.mktemp("console-fabric")) / "home", running=True)
    with env.client:
        approve_grant_over_the_api(env)
        for _ in range(100):  # the reconciler runs on its own thread, woken by the approval
            rows = {r["device"]: r for r in env.call("GET", "/v1/devices", "admin").json()}
            if rows["nic:gpu1"]["desired_version"] == 2:
                break
            import time

            time.sleep(0.05)
        for device, extra in (("nic:gpu1", {"counters": {"0x2a": {"packets": 1234, "bytes": 98765},
                                                         "0x2b": {"packets": 7, "bytes": 700}}}),
                              ("nic:gpu2", {"drift": ["flow cookie 0x2c missing"], "drift_repaired": True}),
                              ("leaf:leaf1", {"last_error": "nv config apply: timeout"})):
            row = rows[device]
            r = env.call("POST", f"/v1/devices/{device}/status", "admin",
                         json={"applied_version": row["desired_version"], "applied_hash": row["desired_hash"],
                               **extra})
            assert r.status_code == 200, r.text
        yield env
    env.client.close()
    env.ctx.close()


def _api(env: Env) -> dict[str, Any]:
    return {r["device"]: r for r in env.call("GET", "/v1/devices", "auditor").json()}


def test_the_device_list_shows_what_the_api_answers(fenv: Env) -> None:
    api = _api(fenv)
    client = sign_in(fenv, "auditor")
    r = client.get("/console/devices")
    assert r.status_code == 200, r.text
    shown = re.findall(r'<td><a href="/console/devices/([^"]+)">', r.text)
    assert [s.replace("%3A", ":") for s in shown] == sorted(api), "every device, in the API's order"
    assert "1,241" in r.text, "nic:gpu1's packets, summed from its counters"
    assert "nv config apply: timeout" in r.text
    r = client.get("/console/devices", params={"state": "attention"})
    attention = {s.replace("%3A", ":") for s in re.findall(r'<td><a href="/console/devices/([^"]+)">', r.text)}
    assert "leaf:leaf1" in attention and "nic:gpu1" not in attention and "nic:gpu2" not in attention
    r = client.get("/console/devices", params={"state": "in-sync", "search": "gpu"})
    assert re.findall(r'<td><a href="/console/devices/([^"]+)">', r.text) == ["nic%3Agpu1", "nic%3Agpu2"]
    assert client.get("/console/devices", params={"state": "bogus"}).status_code == 400


def test_a_device_detail_has_its_rule_set_history_and_counters(fenv: Env) -> None:
    client = sign_in(fenv, "security")
    r = client.get("/console/devices/nic:gpu1")
    assert r.status_code == 200, r.text
    ruleset = fenv.call("GET", "/v1/devices/nic:gpu1/ruleset", "security").json()
    history = fenv.call("GET", "/v1/devices/nic:gpu1/versions", "security").json()["items"]
    assert f"{len(ruleset['ir']['rules'])} rules" in r.text and ruleset["cause"] in r.text
    assert [v["version"] for v in history] == [2, 1]
    for v in history:
        assert v["cause"] in r.text and v["content_hash"][:16] in r.text
    assert "grant:" in r.text, "the grant behind its newest rules is named (and linked)"
    assert "1,234" in r.text and "0x2a" in r.text
    r = client.get("/console/devices/nic:nowhere")
    assert r.status_code == 404 and "nic:nowhere" in r.text
    r = client.get("/console/devices/leaf:leaf1")
    assert r.status_code == 200 and "VRFs" in r.text and "nv config apply: timeout" in r.text


def test_a_tenant_session_cannot_read_the_platform(fenv: Env) -> None:
    client = sign_in(fenv, "tenant-admin", "acme")
    for url in ("/console/devices", "/console/devices/nic:gpu1"):
        r = client.get(url)
        assert r.status_code == 403 and "device.read" in r.text, r.text
    assert "/console/devices" not in client.get("/console/tenants/acme").text, "no link to it either"


def test_the_impact_report_names_the_devices_a_version_changes(fenv: Env) -> None:
    r = fenv.call("POST", "/v1/policy/versions", "security", json={"modules": candidate(), "note": "no platform"})
    assert r.status_code == 201, r.text
    number = r.json()["number"]
    report = fenv.call("GET", f"/v1/policy/versions/{number}/impact?limit=0", "security").json()
    client = sign_in(fenv, "security")
    r = client.get(f"/console/policy/versions/{number}/impact", headers={"HX-Request": "true"})
    assert r.status_code == 200, r.text
    touched = report["devices"]["by_device"]
    assert touched and f"{report['devices']['touched']} of {report['devices']['devices']}" in r.text
    for p in touched:
        assert f'/console/devices/{p["device"].replace(":", "%3A")}' in r.text
    r = client.get(f"/console/policy/versions/{number}/activate")
    assert f"changes the rule sets of {report['devices']['touched']} of" in r.text


def test_a_device_over_its_budget_shows_what_it_withholds(fenv: Env) -> None:
    """The device API answered what a fitted device withholds (enforcer.fairshare), the console's pages did not:
    an operator saw a device in sync and no word of the tenants' flows it denies to fit its budget."""
    from datetime import UTC, datetime

    from audit import Actor, record

    def withhold(rows: list[dict[str, Any]]) -> None:
        with fenv.ctx.db.session() as s:  # what a fitted publication records (enforcer.reconcile._withhold)
            record(s, actor=Actor("trustfabric", "system"), action="enforcer.withhold", object_type="device",
                   object_id="leaf:leaf2", summary={"device": "leaf:leaf2", "withheld": rows},
                   reason="over budget", at=datetime.now(UTC))

    withhold([{"tenant": "acme", "entries": 3, "cost": 28,
               "flows": [f"grant:g-{i} tcp to globex/api" for i in range(3)]}])
    try:
        assert _api(fenv)["leaf:leaf2"]["withheld"] == [{"tenant": "acme", "entries": 3, "cost": 28}]
        client = sign_in(fenv, "auditor")
        r = client.get("/console/devices/leaf:leaf2")
        assert r.status_code == 200, r.text
        assert "Withheld (over budget)" in r.text and "acme: 3 entries (28 ACL entries)" in r.text
        r = client.get("/console/devices")
        assert "over budget: withholds acme 3" in r.text
    finally:
        withhold([])
    r = sign_in(fenv, "auditor").get("/console/devices/leaf:leaf2")
    assert "Withheld (over budget)" not in r.text


def test_the_platform_pages_in_a_browser(browser: Any, fenv: Env) -> None:
    shots = Shots()
    with serving(fenv) as live:
        page = signed_in_page(browser, live, shots, "security")
        page.get_by_role("link", name="Platform").click()
        page.wait_for_url(re.compile(r".*/console/devices$"))
        assert page.locator("table tbody tr").count() == len(_api(fenv))
        shots.take(page, "platform")
        page.get_by_role("link", name="nic:gpu1").click()
        page.get_by_role("heading", name="Versions").wait_for()
        assert page.locator("table").nth(0).is_visible()
        shots.take(page, "device")
        page.context.close()
    assert not shots.problems, shots.problems
