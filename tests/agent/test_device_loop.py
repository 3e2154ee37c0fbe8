"""One device's loop (agent/device_loop.py) against a server that stalls: the real server behind the slow-server
tests' gate (tests/agent/test_slow_server.py), and leaf1's rule sets applied through the NVUE stand-in (a Cumulus
switch's API: tests/enforcer/nvue_standin.py) by a DeviceLoop of kind "leaf", which reads the fabric view the server
names with each rule set as the lab's Linux leaf does; its poller, checker and reporter threads run.

- while a rule set's fabric-view request is stalled at the server, the checker repairs a hand edit on the switch at
  once (the loop held its device lock across that request: the repair waited for the server);
- while a status report is stalled, a rule set is applied at once (the checker held the lock across its report: the
  apply waited), and the reports go in order, one at a time: the stalled one, then the newer ones;
- (review-agent) a report the server answers 503 is sent again, not lost: the drift repair it says is audited;
- (agentsec) a report the server processes late (its request timed out on the agent, was sent again and stored, and
  newer reports after it) does not overwrite the newer status: the reports are numbered and the late one is stale."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from agent.api import VIEW_KEY
from agent.device_loop import DeviceLoop
from agent.wiring import DeviceWiring
from enforcer.backends.nvue import NvueBackend, managed
from enforcer.fabric import Fabric
from enforcer.ir import DeviceRuleSet
from enforcer.render.nvue import render_nvue
from tests.agent.harness import FAST, Served, served_fabric
from tests.agent.test_slow_server import Gate, _ask, _until
from tests.enforcer.nvue_standin import NvueStandIn

pytestmark = pytest.mark.xdist_group("agent-device-loop")
DEVICE = "leaf:leaf1"
FABRIC_PATH, STATUS_PATH = f"/v1/devices/{DEVICE}/fabric", f"/v1/devices/{DEVICE}/status"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_fabric(tmp_path_factory.mktemp("agent-device-loop")) as s:
        s.stop()
        s.env.app = Gate(s.env.app)  # type: ignore[assignment]
        s.start()
        yield s


@dataclass
class Leaf:
    served: Served
    loop: DeviceLoop
    switch: NvueStandIn
    gate: Gate


@pytest.fixture
def leaf(served: Served) -> Iterator[Leaf]:
    """leaf1's loop, started and in sync (the server says so); the gate released and the loop stopped after."""
    gate = served.env.app
    assert isinstance(gate, Gate)
    with NvueStandIn(ports=("swp1", "swp2", "swp31")) as switch:
        agent = served.agent("leaf1", maintenance_every=3600.0)  # no device of its own: the loop below is its one
        backend = NvueBackend(switch.url)

        def make(fabric: Fabric | None) -> NvueBackend:
            assert fabric is not None  # the view the server named, fetched or held
            return backend

        stop = threading.Event()
        loop = DeviceLoop(DeviceWiring(DEVICE, "leaf", make), agent.api, agent.metrics, stop, FAST)
        loop.start()
        try:
            assert _until(lambda: loop.good is not None and _in_sync(served), 30)
            yield Leaf(served, loop, switch, gate)
        finally:
            gate.release()
            stop.set()
            served.agents.pop("leaf1").stop()  # (its client closed: a long-poll held ends)
            loop.join(5)
            backend.client.close()


def _in_sync(served: Served) -> bool:
    r = served.env.call("GET", "/v1/devices", "admin")
    assert r.status_code == 200, r.text
    d = next(x for x in r.json() if x["device"] == DEVICE)
    return bool(d["in_sync"]) and not d["last_error"]


def _repairs_audited(served: Served) -> int:
    """device.status events of the leaf that say its drift was repaired."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        r = served.env.call("GET", "/v1/audit/events", "admin",
                            params={"action": "device.status", "limit": 1000, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    return len([e for e in items if e["object"]["id"] == DEVICE and (e.get("summary") or {}).get("drift_repaired")])


def _delete_an_acl(switch: NvueStandIn) -> None:
    """Someone deletes one of our ACLs on the switch by hand."""
    with switch.lock:
        acl = sorted(switch.applied["acl"])[0]
        del switch.applied["acl"][acl]
        for body in switch.applied.get("interface", {}).values():
            body.get("acl", {}).pop(acl, None)


def _as_desired(switch: NvueStandIn, rules: DeviceRuleSet) -> bool:
    with switch.lock:
        return managed(switch.applied) == render_nvue(rules)


def _ruleset(leaf: Leaf) -> dict[str, Any]:
    doc = leaf.loop.api.ruleset(DEVICE, None, 0)
    assert doc is not None
    return doc


def test_a_stalled_fabric_view_request_does_not_hold_up_the_drift_repair(leaf: Leaf) -> None:
    """Should fix (agentfair): a rule set naming a fabric view the loop does not hold fetched it under the device lock,
    so while the server did not answer, the checker could not repair the device (a request's timeout: 10 s)."""
    loop, switch = leaf.loop, leaf.switch
    assert loop.good is not None
    rules, fetches = loop.good.rules, loop.view_fetches
    doc = {**_ruleset(leaf), VIEW_KEY: "a-view-not-held"}
    rnd = leaf.gate.close(FABRIC_PATH)
    take = _ask(loop.take, doc)  # as the poller takes a rule set naming a new view
    assert _until(lambda: rnd.arrived.get(FABRIC_PATH) == 1, 5)
    _delete_an_acl(switch)
    assert not _as_desired(switch, rules)
    assert _until(lambda: _as_desired(switch, rules), 5), "the drift repair waited for the fabric view request"
    assert take.thread.is_alive()  # still stalled at the server
    leaf.gate.release()
    assert take.join(15).error is None and take.result is True
    assert loop.view_fetches == fetches + 1


def test_a_stalled_status_report_does_not_hold_up_an_apply(leaf: Leaf) -> None:
    """Should fix (agentfair): the checker reported a drift repair under the device lock, so while the server did not
    take the report, the poller could not apply a rule set. Now the reporter sends it, and the newer statuses after it,
    in order: the stalled one first, the device in sync at the server once it answers."""
    loop, switch = leaf.loop, leaf.switch
    assert loop.good is not None
    rules = loop.good.rules
    doc = _ruleset(leaf)
    audited = _repairs_audited(leaf.served)
    before = loop.repairs
    rnd = leaf.gate.close(STATUS_PATH)
    _delete_an_acl(switch)
    assert _until(lambda: loop.repairs > before and rnd.arrived.get(STATUS_PATH) == 1, 5)  # a report stalled
    assert _as_desired(switch, rules)
    repairs, applies = loop.repairs, loop.metrics.applies.labels(DEVICE)._value.get()
    take = _ask(loop.take, doc).join(5)  # as the poller takes a rule set
    assert not take.thread.is_alive(), "the apply waited for the status report"
    assert take.error is None and take.result is True
    assert loop.metrics.applies.labels(DEVICE)._value.get() == applies + 1
    assert rnd.arrived == {STATUS_PATH: 1}  # one report in flight at a time
    leaf.gate.release()
    assert _until(lambda: rnd.arrived.get(STATUS_PATH, 0) >= 2, 10)  # the newer ones after it
    assert _until(lambda: _in_sync(leaf.served), 10)
    assert _repairs_audited(leaf.served) == audited + 1  # the repair's report, not replaced by the newer ones
    assert loop.repairs == repairs


def test_a_status_report_the_server_fails_is_sent_again_not_lost(leaf: Leaf) -> None:
    """Should fix (review-agent): the reporter took a status out of the outbox and, when the server answered 503 (or
    not at all), dropped it: a drift repair made while the server was recovering was never audited (the next
    statuses, drift cleared, do not say it). Now a report the server fails for now is sent again, first, after a
    backoff; the statuses left after it follow in order."""
    loop, switch = leaf.loop, leaf.switch
    assert loop.good is not None
    rules = loop.good.rules
    audited = _repairs_audited(leaf.served)
    before = loop.repairs
    rnd = leaf.gate.close(STATUS_PATH, refuse=2)  # the first two reports answered 503, the server unasked
    leaf.gate.release()
    _delete_an_acl(switch)
    assert _until(lambda: loop.repairs > before and rnd.refused >= 2, 10)
    assert _as_desired(switch, rules)
    assert _until(lambda: _repairs_audited(leaf.served) == audited + 1, 10), "the repair's report was lost"
    assert _until(lambda: _in_sync(leaf.served), 10)


def test_a_status_report_the_server_processes_late_does_not_overwrite_a_newer_one(leaf: Leaf) -> None:
    """Should fix (agentsec): the server took the last report to arrive. The drift repair's report reaches the server,
    which does not process it before the agent's request times out; the agent sends it again (stored, audited), then
    a newer status (drift cleared, stored). When the server processes the first request at last, it set the device
    back to the repair's status (and audited the change again). Now the agent numbers its reports and the late one,
    numbered below the stored one, changes nothing."""
    loop, switch = leaf.loop, leaf.switch
    assert loop.good is not None
    rules = loop.good.rules
    audited = _repairs_audited(leaf.served)
    before, timeout = loop.repairs, loop.api.timeout
    loop.api.timeout = 1.5  # the agent gives up on the held request soon
    try:
        rnd = leaf.gate.close(STATUS_PATH, late=1)  # the first report is held at the server, the others pass
        _delete_an_acl(switch)
        assert _until(lambda: loop.repairs > before and rnd.arrived.get(STATUS_PATH) == 1, 5)
        assert _as_desired(switch, rules)
        assert _until(lambda: _repairs_audited(leaf.served) == audited + 1, 15), "the repair's retry not stored"
        assert _until(lambda: not _device(leaf.served)["drift_repaired"], 15), "no newer status stored"
        stored = _device(leaf.served)
        assert stored["report_seq"] is not None and rnd.held == 1
        leaf.gate.release()  # the server processes the first request now: its client is long gone
        assert _until(lambda: rnd.held == 0, 10)
        now = _device(leaf.served)
        assert not now["drift_repaired"] and now["drift"] == [], "the late report overwrote a newer one"
        assert now["report_seq"] >= stored["report_seq"]
        assert _repairs_audited(leaf.served) == audited + 1
    finally:
        loop.api.timeout = timeout


def test_a_reporter_behind_the_servers_number_goes_above_it(leaf: Leaf) -> None:
    """The server holds a report numbered above anything this agent numbers (another agent process for the device
    with its clock far ahead, or this host's clock stepped back across a restart): the loop's reports are answered
    stale; it takes the server's number as its floor and sends its status again above it, at once."""
    loop = leaf.loop
    applied = {"applied_version": _device(leaf.served)["applied_version"],
               "applied_hash": _device(leaf.served)["applied_hash"]}
    ahead = time.time_ns() + 3600 * 10**9  # an hour ahead (the server refuses one 7 days ahead of its clock)
    r = leaf.served.env.call("POST", STATUS_PATH, "admin",
                             json={**applied, "last_error": "a process with its clock far ahead", "report_seq": ahead})
    assert r.status_code == 200 and r.json()["stale"] is False, r.text
    stale = loop.stale_reports
    assert _until(lambda: _device(leaf.served)["last_error"] is None, 15), "the agent's reports stayed stale"
    assert _device(leaf.served)["report_seq"] > ahead and loop.stale_reports > stale


def test_a_reporter_whose_clock_ran_ahead_reports_again_once_it_is_set_right(leaf: Leaf,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Should fix (review-agentsec): the server refuses a report numbered more than 7 days ahead of its clock, so a
    host whose clock runs ten days ahead has its reports refused (that is the bound doing its work). Once the clock is
    set right, the loop numbered its reports from the last number it had given, ten days ahead, and every report
    stayed refused for ten days. Now a number the server refused does not raise the loop's floor."""
    loop, day = leaf.loop, 86_400 * 10**9
    applied = {"applied_version": _device(leaf.served)["applied_version"],
               "applied_hash": _device(leaf.served)["applied_hash"]}
    caplog.set_level(logging.WARNING, logger="trustfabric.agent")
    loop._time_ns = lambda: time.time_ns() + 10 * day  # the host's clock ten days ahead
    try:
        r = leaf.served.env.call("POST", STATUS_PATH, "admin", json={**applied, "last_error": "marker"})  # unnumbered
        assert r.status_code == 200, r.text
        assert _until(lambda: "ahead of the server's clock" in caplog.text, 15), "the agent's reports were not refused"
        assert _device(leaf.served)["last_error"] == "marker"
    finally:
        loop._time_ns = time.time_ns  # set right
    assert _until(lambda: _device(leaf.served)["last_error"] is None, 15), "the agent's reports stayed refused"
    assert _device(leaf.served)["report_seq"] < time.time_ns() + 7 * day


def test_a_device_whose_stored_number_is_at_the_top_of_the_range_reports_again(leaf: Leaf) -> None:
    """Should fix (review-agentsec): a stored report_seq of 2**63-1 (a buggy or compromised agent's report) held the
    device's reports stale for good: the loop took it as its floor, and its next number, 2**63, was refused as out of
    range, for ever (an operator could only edit the database). Now the server binds no report with a number far ahead
    of its clock, and refuses to store one."""
    applied = {"applied_version": _device(leaf.served)["applied_version"],
               "applied_hash": _device(leaf.served)["applied_hash"]}
    r = leaf.served.env.call("POST", STATUS_PATH, "admin", json={**applied, "last_error": "marker"})  # unnumbered
    assert r.status_code == 200, r.text
    with leaf.served.env.ctx.db.session() as s:
        s.execute(text("UPDATE enforcer_devices SET report_seq = :top WHERE device = :d"),
                  {"top": 2**63 - 1, "d": DEVICE})
    assert _until(lambda: _device(leaf.served)["last_error"] is None, 15), "the agent's reports stayed stale"
    assert _device(leaf.served)["report_seq"] < 2**63 - 1
    r = leaf.served.env.call("POST", STATUS_PATH, "admin", json={**applied, "report_seq": 2**63 - 1})
    assert r.status_code == 400 and "ahead of the server's clock" in r.text, r.text


def _device(served: Served) -> dict[str, Any]:
    r = served.env.call("GET", f"/v1/devices/{DEVICE}", "admin")
    assert r.status_code == 200, r.text
    return dict(r.json())
