"""Killed mid-apply, restart converges: the installed `trustfabric agent` binary, run as its own process for
gpu1 against a real server over TLS and the golden lab in agent mode (the other nodes' agents on threads of
this process), is stopped by `kill -9` at a named step of its apply and started again.

The moment is deterministic: the process runs with TRUSTFABRIC_TEST_PAUSE (core.testpoints), reaches the
point, writes a ready file and waits; the test sees the file, checks the wire in that in-between state and
kills. Two windows:
  - the OVS backend wrote its flow file but did not commit the bundle: the SuperNIC still runs the old set
    (the new grant is not open yet); the restarted agent must apply the new one;
  - the bundle is committed but the agent neither recorded nor reported it: the wire is already open, the
    server still shows the old version; the restarted agent must find it installed, apply nothing and report.
Either way the device converges to the desired set, the server sees it in sync and the wire is right.

On the same lab: a leaf's agent reads its fabric view again only when the hash the server sends with the
rule set (X-Fabric-View) changed: a grant costs it no second request, a moved address does."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from enforcer.leaf_view import view_hash
from lab.probe import connect, endpoint, listening
from tests.agent.harness import Served
from tests.agent.process import AgentProcess, lab_served
from tests.lab.conftest import OPEN
from tests.policy.conftest import free_port

pytestmark = [pytest.mark.netns, pytest.mark.xdist_group("agent-e2e")]  # one lab at a time beside the e2e's
VICTIM = "gpu1"  # holds acme/train/w1, the grant's source
THREADS = ("gpu2", "gpu3", "gpu4", "leaf1", "leaf2")


@dataclass
class Rig:
    served: Served
    st: dict[str, Any]
    agent: AgentProcess
    metrics_port: int

    def devices(self) -> dict[str, dict[str, Any]]:
        r = self.served.env.call("GET", "/v1/devices", "admin")
        assert r.status_code == 200, r.text
        return {d["device"]: d for d in r.json()}

    def start(self, pause: str | None = None, ready: Path | None = None) -> subprocess.Popen[bytes]:
        return self.agent.start({"TRUSTFABRIC_TEST_PAUSE": f"{pause}={ready}"} if pause else None)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.agent.stop(sig)

    def wait(self, check: Any, what: str) -> None:
        self.agent.wait(check, what)

    def victim_in_sync(self) -> bool:
        return self.agent.in_sync(f"nic:{VICTIM}")

    def applies(self) -> float:
        """The running process's apply count for its NIC, from its Prometheus endpoint."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        series = f'trustfabric_agent_applies_total{{device="nic:{VICTIM}"}}'
        line = next(x for x in text.splitlines() if x.startswith(series))
        return float(line.rsplit(" ", 1)[1])

    def metrics_up(self) -> bool:
        try:
            self.applies()
        except (httpx.HTTPError, StopIteration):
            return False
        return True

    def is_open(self, src: str, dst: str, port: int, expect: bool = False) -> bool:
        """One connection; one expected to open gets the lab's generous timeout (a loaded machine), a blocked
        one never opens by waiting, so it gets a short one."""
        s, d = endpoint(self.st, src), endpoint(self.st, dst)
        with listening([(d, 4, port)]):
            return connect(s, d, port, 4, timeout=OPEN if expect else 0.5)[0]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("agent-kill")
    with lab_served(root) as (served, lab_home, st):
        for node in THREADS:
            served.agent(node, lab=lab_home)
        port = free_port()
        r = Rig(served, st, AgentProcess(served, VICTIM, root / "logs", "--lab", str(lab_home), "--metrics",
                                         f"127.0.0.1:{port}"), port)
        try:
            r.start()
            r.wait(lambda: all(d["in_sync"] for d in r.devices().values()), "every device applied")
            yield r
        finally:
            r.stop()


def approve(rig: Rig) -> str:
    env = rig.served.env
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={
        "src_group": "train", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "ttl_seconds": 3600})
    assert r.status_code == 201, r.text
    gid = str(r.json()["id"])
    r = env.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={})
    assert r.status_code < 300, r.text
    return gid


def revoke(rig: Rig, gid: str) -> None:
    r = rig.served.env.call("POST", f"/v1/grants/{gid}/revoke", "tenant-admin", "globex", json={"reason": "over"})
    assert r.status_code < 300, r.text


@pytest.mark.parametrize(("point", "open_at_kill", "applies_after"), [
    ("ovs.apply.before-commit", False, 1.0),
    ("agent.apply.unrecorded", True, 0.0),
])
def test_killed_mid_apply_the_restarted_agent_converges(rig: Rig, tmp_path: Path, point: str, open_at_kill: bool,
                                                        applies_after: float) -> None:
    src, dst = "acme/train/w1", "globex/api/a1"
    rig.stop()
    before = rig.devices()[f"nic:{VICTIM}"]
    gid = approve(rig)
    try:
        rig.wait(lambda: rig.devices()[f"nic:{VICTIM}"]["desired_version"] > before["desired_version"],
                 "the grant published for the victim's NIC")
        # the other devices take the grant; the victim's NIC, which its absent agent did not change, decides
        rig.wait(lambda: all(d["in_sync"] for n, d in rig.devices().items() if n != f"nic:{VICTIM}"),
                 "every other device applied the grant")
        assert not rig.is_open(src, dst, 8443)

        ready = tmp_path / "paused"
        proc = rig.start(point, ready)
        rig.wait(ready.exists, f"the agent paused at {point}")
        assert int(ready.read_text()) == proc.pid
        assert rig.is_open(src, dst, 8443, expect=open_at_kill) is open_at_kill  # the in-between state, on the wire
        d = rig.devices()[f"nic:{VICTIM}"]
        assert d["applied_version"] == before["applied_version"] and not d["in_sync"]  # nothing reported yet
        rig.stop(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL

        rig.start()
        rig.wait(rig.victim_in_sync, "the restarted agent converged and reported")
        rig.wait(rig.metrics_up, "the restarted agent's metrics")
        assert rig.applies() == applies_after  # the missing set applied, or the installed one recognised
        assert rig.is_open(src, dst, 8443, expect=True)
        assert not rig.is_open(dst, src, 443)  # one way, as ever
    finally:
        revoke(rig, gid)
    rig.wait(lambda: not rig.is_open(src, dst, 8443), "the revocation reached the wire")
    rig.wait(rig.victim_in_sync, "the victim in sync after the revocation")


def test_a_leaf_reads_its_fabric_view_again_only_when_it_changed(rig: Rig) -> None:
    env = rig.served.env
    r = env.call("GET", "/v1/devices/leaf:leaf1/ruleset", "admin")
    view = env.call("GET", "/v1/devices/leaf:leaf1/fabric", "admin")
    assert r.status_code == view.status_code == 200
    assert r.headers["X-Fabric-View"] == view_hash(view.json()) == view.headers["ETag"].strip('"')
    assert "X-Fabric-View" not in env.call("GET", "/v1/devices/nic:gpu2/ruleset", "admin").headers
    loop = rig.served.agents["leaf1"].loops[0]
    assert loop.good is not None

    def applied_after(version: int) -> Any:
        return lambda: loop.good is not None and loop.good.version > version and rig.victim_in_sync() and \
            all(d["in_sync"] for d in rig.devices().values())

    fetches, version = loop.view_fetches, loop.good.version
    gid = approve(rig)
    try:
        rig.wait(applied_after(version), "leaf1 applied the grant")
        assert loop.view_fetches == fetches  # the rule set changed, the view did not: no second request
    finally:
        revoke(rig, gid)
    rig.wait(applied_after(version + 1), "leaf1 applied the revocation")
    assert loop.view_fetches == fetches

    def place(ipv4: str) -> None:
        r = env.call("PUT", "/v1/fabric/placements/globex/batch/b1", "admin",
                     json={"node": "gpu1", "port": "pf0vf1", "ipv4": ipv4})
        assert r.status_code == 200, r.text

    version = loop.good.version
    place("10.2.0.22")  # the view changes: its routes need it
    try:
        rig.wait(applied_after(version), "leaf1 applied the moved address")
        assert loop.view_fetches == fetches + 1
        assert not loop.good.backend.drift(loop.good.rules)
        assert "10.2.0.22/32" in loop.good.backend.installed()
    finally:
        version = loop.good.version
        place("10.2.0.21")
    rig.wait(applied_after(version), "leaf1 applied the address moved back")
    assert loop.view_fetches == fetches + 2
