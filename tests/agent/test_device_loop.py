"""One device's loop (agent/device_loop.py) against a server that stalls: the real server behind the slow-server
tests' gate (tests/agent/test_slow_server.py), and leaf1's rule sets applied through the NVUE stand-in (a Cumulus
switch's API: tests/enforcer/nvue_standin.py) by a DeviceLoop of kind "leaf", which reads the fabric view the server
names with each rule set as the lab's Linux leaf does; its poller, checker and reporter threads run.

- while a rule set's fabric-view request is stalled at the server, the checker repairs a hand edit on the switch at
  once (the loop held its device lock across that request: the repair waited for the server);
- while a status report is stalled, a rule set is applied at once (the checker held the lock across its report: the
  apply waited), and the reports go in order, one at a time: the stalled one, then the newer ones;
- (review-agent) a report the server answers 503 is sent again, not lost: the drift repair it says is audited."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

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
