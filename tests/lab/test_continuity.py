"""On the golden lab, every device's rule set changes while allowed flows stay busy: none of them loses a packet.

Two connections are watched, a message every 10 ms echoed back: acme/train/w2 (gpu3, leaf2) to acme/data/db1
(gpu2, leaf1) over IPv4, across both leaves and the spine, and acme/train/w1 (gpu1) to db1 over IPv6. Meanwhile
the lab is switched, device by device in parallel as `lab apply` does, between rule sets that all allow both
flows and differ in their own rules (a grant on the same port, a RoCEv2 grant, and back): a NIC's apply is one
OVS bundle, a leaf's one nftables batch replacing its table, so no packet meets half a rule set. Each watched
connection's own TCP counters, on both ends, must show no segment lost, and no echo may wait long. Checked
against applies that are not atomic: a leaf whose table is flushed 50 ms before its new batch, and a NIC whose
flows are deleted 50 ms before the new ones are added, each lose segments on every run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from enforcer.compiler import Compiled, compile_fabric
from enforcer.fabric import revoked_ids
from enforcer.netns import run_in
from lab import standalone, state
from lab.probe import endpoint
from tests.flow_watch import FlowWatcher, Watch, connect_from, echo_server
from tests.lab.conftest import LAB, GoldenLab

pytestmark = LAB
PORT = 5432
GRANTS = [
    {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [PORT], "reason": "grant:pin",
     "sources": ["acme/train"]},
    {"dst_tenant": "acme", "dst_group": "data", "proto": "udp", "ports": [4791], "reason": "grant:roce",
     "sources": ["acme/train"]},
]
WATCHED = [("acme/train/w2", 4), ("acme/train/w1", 6)]  # (source, family) to acme/data/db1
ROUNDS = 4
PAUSE = 0.1
MAX_GAP = 1.5  # a loaded lab applies ten devices per change; a lost segment shows in the counters anyway


@pytest.fixture
def restored(golden_lab: GoldenLab) -> Iterator[GoldenLab]:
    try:
        yield golden_lab
    finally:
        golden_lab.restore()


def _variants(lab: GoldenLab) -> list[tuple[str, Compiled]]:
    rev = revoked_ids(lab.fabric)
    return [("grant on the same port", compile_fabric(lab.fabric, [*lab.allowed, GRANTS[0]], rev)),
            ("roce grant", compile_fabric(lab.fabric, [*lab.allowed, GRANTS[1]], rev)),
            ("golden", lab.compiled)]


RUNS_AT_MOST = 3


def test_allowed_flows_survive_every_devices_rule_set_changing(restored: GoldenLab) -> None:
    lab = restored
    variants = _variants(lab)
    for name, compiled in variants[:2]:  # each change reaches both leaves and the NICs of the watched flows
        changed = {d for d, rs in compiled.devices.items() if rs.content_hash != lab.compiled.devices[d].content_hash}
        assert {"leaf:leaf1", "leaf:leaf2", "nic:gpu1", "nic:gpu2", "nic:gpu3"} <= changed, (name, sorted(changed))
    # A host that stalls the whole machine (the suite's two shared cores, or the hypervisor's steal time: 0.9 s on
    # every flow at once was seen) can make the userspace OVS datapath drop a segment in a run (seen: one, on
    # either side). An apply that is not atomic loses segments in every run (the module docstring), so a lossy run
    # is run again, up to RUNS_AT_MOST in all, and one must lose none.
    runs = [_switch_while_watched(lab, variants)]
    while sum(runs[-1]["segments lost"].values()) and len(runs) < RUNS_AT_MOST:
        runs.append(_switch_while_watched(lab, variants))
    assert sum(runs[-1]["segments lost"].values()) == 0, json.dumps(runs)


def _switch_while_watched(lab: GoldenLab, variants: list[tuple[str, Compiled]]) -> dict[str, Any]:
    """Switch every device between `variants` ROUNDS times while the WATCHED connections are busy, ending on the
    golden set; what was seen (the shape-level checks asserted here, the segments lost returned)."""
    db1 = endpoint(lab.st, "acme/data/db1")
    sources = [(endpoint(lab.st, w), family) for w, family in WATCHED]
    applied: list[tuple[float, str, list[str]]] = []
    watches: list[Watch] = []
    with ExitStack() as stack:
        server = stack.enter_context(echo_server(db1.netns, PORT))
        watchers = [stack.enter_context(FlowWatcher(run_in(src.netns, connect_from, src.address(family),
                                                           db1.address(family), PORT)))
                    for src, family in sources]
        time.sleep(0.3)
        for _ in range(ROUNDS):
            for name, compiled in variants:
                devices = standalone.apply(lab.st, lab.fabric, compiled, only_changed=True)
                applied.append((round(time.monotonic() - watchers[0].watch.started, 3), name, devices))
                time.sleep(PAUSE)
        time.sleep(0.3)
        watches = [w.stop() for w in watchers]
        server_lost = server.lost()
    state.save(lab.home, lab.st)
    again = {f"{src.workload} IPv{family}": w.lost for (src, family), w in zip(sources, watches, strict=True)}
    again[db1.workload] = server_lost
    report: dict[str, Any] = {
        "segments lost": again,
        "applies (time, set, devices)": applied,
        "watched": [{"flow": f"{src.workload} -> {db1.workload} IPv{family}", "error": w.error, "sent": w.sent,
                     "echoed": len(w.echoed), "gaps over 0.1 s (start, length)": w.gaps_over(0.1)}
                    for (src, family), w in zip(sources, watches, strict=True)]}
    context = json.dumps(report)
    assert all(len(devices) >= 5 for _, _, devices in applied), context
    for w in watches:
        assert w.error is None and w.sent > ROUNDS * len(variants) * PAUSE / 0.01 / 2, context
        assert len(w.echoed) == w.sent, context
        assert w.max_gap() < MAX_GAP, context
    return report
