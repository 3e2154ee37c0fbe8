"""RoCEv2 on the golden lab, across the leaves: a grant globex/api -> acme/train on udp 4791 and 9000. RoCEv2
(UDP to 4791 from a varying source port, in both directions) passes both ways through the SuperNICs (no
conntrack) and the Linux leaves (the leaf's return rule for RoCEv2 is on destination port 4791: the source-port
return rule every other UDP service gets cannot match it); udp/9000 of the same grant stays one way with
conntrack return; a pair with no grant gets no RoCEv2 either way. The equivalence walk agrees with the wire."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest

from enforcer.compiler import Compiled, recompile
from enforcer.equivalence import Walker, verify
from enforcer.netns import run_in
from lab import standalone
from lab.probe import Endpoint, endpoint
from tests.lab.conftest import LAB, GoldenLab

pytestmark = LAB
GRANT = {"dst_tenant": "acme", "dst_group": "train", "proto": "udp", "ports": [4791, 9000], "reason": "grant:roce",
         "sources": ["globex/api"]}


def _bound(addr: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    s.settimeout(1.0)
    return s


def _arrives(src: Endpoint, sport: int, dst: Endpoint, dport: int, tries: int = 1) -> bool:
    """A datagram src:sport -> dst:dport (sent again up to `tries` times); True when dst got it from there."""
    assert src.ipv4 and dst.ipv4
    rx = run_in(dst.netns, _bound, dst.ipv4, dport)
    tx = run_in(src.netns, _bound, src.ipv4, sport)
    try:
        for _ in range(tries):
            tx.sendto(b"roce", (dst.ipv4, dport))
            try:
                data, peer = rx.recvfrom(64)
            except TimeoutError:
                continue
            return data == b"roce" and peer == (src.ipv4, sport)
        return False
    finally:
        rx.close()
        tx.close()


@pytest.fixture
def roce(golden_lab: GoldenLab) -> Iterator[Compiled]:
    lab = golden_lab
    b = recompile(lab.compiled, [*lab.allowed, GRANT])
    assert verify(b, [*lab.allowed, GRANT], exhaustive=True) == []
    try:
        for device in b.changed:
            standalone.backend(lab.st, device, lab.fabric).apply(b.devices[device])
        yield b
    finally:
        lab.restore()


def test_roce_passes_both_ways_across_the_leaves_and_the_other_port_one_way(golden_lab: GoldenLab,
                                                                           roce: Compiled) -> None:
    ep = {k: endpoint(golden_lab.st, k) for k in golden_lab.st["workloads"]}
    a1, w1, w2, b1 = ep["globex/api/a1"], ep["acme/train/w1"], ep["acme/train/w2"], ep["globex/batch/b1"]
    walker = Walker(roce)
    placement = roce.fabric.placement

    def both(src: Endpoint, sport: int, dst: Endpoint, port: int, tries: int) -> bool:
        wire = _arrives(src, sport, dst, port, tries)
        assert walker.walk(placement[src.workload], placement[dst.workload], 4, "udp", port)[0] is wire
        return wire

    # a1 (gpu3, leaf2) -> w1 (gpu1, leaf1): the grant's direction, and RoCEv2 back from another port
    assert both(a1, 50001, w1, 4791, tries=10)
    assert both(w1, 50002, a1, 4791, tries=3)
    assert both(w2, 50003, a1, 4791, tries=10)  # w2 shares a1's node and leaf
    # udp/9000 of the same grant: a1 opens it, w1 does not (conntrack return only)
    assert both(a1, 50004, w1, 9000, tries=10)
    assert not both(w1, 50005, a1, 9000, tries=2)
    # no grant between globex/batch and acme/train: no RoCEv2 either way
    assert not both(b1, 50006, w1, 4791, tries=2)
    assert not both(w1, 50007, b1, 4791, tries=2)


def test_a_leaf_with_a_source_port_return_rule_drops_roce_coming_back(golden_lab: GoldenLab,
                                                                      roce: Compiled) -> None:
    """The NICs pass RoCEv2 both ways, so the leaf alone decides: with the return rule every other UDP service
    gets (source port 4791, the service answering), RoCEv2 from w1 back to a1 dies on leaf1."""
    ep = {k: endpoint(golden_lab.st, k) for k in golden_lab.st["workloads"]}
    a1, w1 = ep["globex/api/a1"], ep["acme/train/w1"]
    leaf1 = roce.devices["leaf:leaf1"]
    sport_only = tuple(r._replace(port_side="src") if r.ports == ((4791, 4791),) and r.port_side == "dst"
                       and r.scope == "acme" and r.dst.startswith("tenants:") else r for r in leaf1.rules)
    assert sport_only != leaf1.rules
    backend = standalone.backend(golden_lab.st, "leaf:leaf1", golden_lab.fabric)
    backend.apply(dataclasses.replace(leaf1, rules=sport_only))
    assert _arrives(a1, 50011, w1, 4791, tries=10)  # the way in is the source leaf's forward rule
    assert not _arrives(w1, 50012, a1, 4791, tries=2)
    backend.apply(leaf1)
    assert _arrives(w1, 50013, a1, 4791, tries=3)
