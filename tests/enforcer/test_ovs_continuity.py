"""A rule set change on a SuperNIC never interrupts a flow that both the old and the new set allow.

acme/train/w1 (gpu1) keeps one TCP connection to acme/data/db1:5433 (gpu2) busy, a message every 10 ms echoed
back, while both bridges are switched again and again between rule sets that all allow it but differ in the
flows of that very pair (a grant on the same ports, a RoCEv2 grant, and back): OvsBackend.apply is one
`ovs-ofctl --bundle replace-flows`, which OVS commits atomically, so no packet ever meets a table half
replaced. Measured against an apply that deletes the flows and adds the new ones 50 ms later: a 1.7 s stall,
21 segments sent again, and this test fails on both counts.
"""

from __future__ import annotations

import json
import time

from enforcer.compiler import Compiled, compile_fabric
from enforcer.fabric import revoked_ids
from enforcer.netns import run_in
from enforcer.ovsd import OvsDaemons
from enforcer.render.openflow import render_openflow
from tests.enforcer.helpers import allowed_flows, small
from tests.enforcer.test_ovs_traffic import ADDR, ROCE, backends, two_nodes  # noqa: F401  (fixture)
from tests.flow_watch import FlowWatcher, connect_from, echo_server

SAME_PORT = {"dst_tenant": "acme", "dst_group": "data", "proto": "tcp", "ports": [5432], "reason": "grant:pin",
             "sources": ["acme/train"]}
ROUNDS = 6
PAUSE = 0.1  # between two applies: the watcher sends ten messages meanwhile
MAX_GAP = 1.0  # seconds without an echo; a lost segment costs at least the 200 ms minimum RTO, usually far more


def _variants() -> list[tuple[str, Compiled]]:
    f = small()
    base, rev = allowed_flows(f), revoked_ids(f)
    return [("base", compile_fabric(f, base, rev)),
            ("grant on the same port", compile_fabric(f, [*base, SAME_PORT], rev)),
            ("roce grant", compile_fabric(f, [*base, ROCE], rev))]


def _pair_flows(compiled: Compiled, device: str) -> set[str]:
    """The device's flows that name w1's or db1's address (what a change of this pair's rules rewrites)."""
    return {line for line in render_openflow(compiled.devices[device]).splitlines()
            if ADDR["w1"] in line or ADDR["db1"] in line}


def test_an_allowed_flow_survives_rule_set_changes_without_a_lost_segment(two_nodes: dict[str, str],  # noqa: F811
                                                                          ovs_daemons: OvsDaemons) -> None:
    variants = _variants()
    for device in ("nic:gpu1", "nic:gpu2"):  # each change rewrites the watched pair's own flows
        flows = [_pair_flows(c, device) for _, c in variants]
        assert all(a != b for a, b in zip(flows, flows[1:] + flows[:1], strict=True)), device
    nics = backends(ovs_daemons, {"gpu1": two_nodes["gpu1"], "gpu2": two_nodes["gpu2"]}, two_nodes["tok"])
    applied: list[tuple[float, str]] = []
    with echo_server(two_nodes["db1"], 5433) as server:  # acme/data's other port (the fixture's server has 5432)
        sock = run_in(two_nodes["w1"], connect_from, ADDR["w1"], ADDR["db1"], 5433)
        with FlowWatcher(sock) as watcher:
            time.sleep(0.3)
            for _ in range(ROUNDS):
                for name, compiled in variants[1:] + variants[:1]:  # ends on the rule set it started with
                    for node, nic in nics.items():
                        nic.apply(compiled.devices[f"nic:{node}"])
                    applied.append((round(time.monotonic() - watcher.watch.started, 3), name))
                    time.sleep(PAUSE)
            time.sleep(0.3)
        watch = watcher.stop()
        again = {"w1": watch.lost, "db1": server.lost()}
    context = json.dumps({"gaps over 0.1 s (start, length)": watch.gaps_over(0.1), "applies (time, set)": applied,
                          "segments lost": again, "sent": watch.sent, "echoed": len(watch.echoed)})
    assert watch.error is None, f"{watch.error}: {context}"
    assert watch.sent > ROUNDS * len(variants) * PAUSE / 0.01 / 2 and len(watch.echoed) == watch.sent, context
    assert again == {"w1": 0, "db1": 0}, context
    assert watch.max_gap() < MAX_GAP, context
