"""The compiled rule sets do exactly what the policy says: green on generated fabrics, red on corruption."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings

from enforcer.compiler import compile_fabric
from enforcer.equivalence import port_classes, verify
from enforcer.fabric import Fabric, revoked_ids
from enforcer.ir import FlowRule, Leak
from tests.enforcer.gen import fabrics
from tests.enforcer.helpers import allowed_flows, compile_small

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(fabrics())
def test_generated_fabrics_are_equivalent_to_the_policy(fabric: Fabric) -> None:
    allowed = allowed_flows(fabric)
    compiled = compile_fabric(fabric, allowed, revoked_ids(fabric))
    assert verify(compiled, allowed, exhaustive=True) == []
    assert verify(compiled, allowed) == []


def test_small_fabric_is_equivalent_and_allows_what_it_should() -> None:
    compiled, allowed = compile_small()
    assert verify(compiled, allowed, exhaustive=True) == []
    from enforcer.equivalence import Walker

    w = Walker(compiled)
    p = compiled.fabric.placement
    assert w.walk(p["acme/train/w1"], p["globex/api/a1"], 4, "tcp", 8443)[0]  # the grant
    assert not w.walk(p["globex/api/a1"], p["acme/train/w1"], 4, "tcp", 443)[0]  # no grant back
    assert w.walk(p["acme/data/db1"], p["acme/train/w1"], 6, "tcp", 443)[0]  # intra-tenant over IPv6
    assert w.walk(p["globex/batch/b1"], p["platform/dns/ns1"], 4, "udp", 53)[0]  # platform service
    denied = w.walk(p["acme/train/w2"], p["globex/batch/b1"], 4, "tcp", 8443)
    assert denied == (False, "nic:gpu3 egress: deny (default-deny)")


def test_a_corrupted_flow_is_named_with_both_answers() -> None:
    compiled, allowed = compile_small()
    nic = compiled.devices["nic:gpu3"]
    rules = list(nic.rules)
    i = next(k for k, r in enumerate(rules) if r.direction == "ingress" and "grant:g-train-api" in r.reasons)
    rules[i] = rules[i]._replace(ports=((8444, 8444),))  # the grant's port, off by one
    compiled.devices["nic:gpu3"] = dataclasses.replace(nic, rules=tuple(rules))
    found = verify(compiled, allowed, exhaustive=True)
    assert [str(m) for m in found] == [
        "acme/train/w1 -> globex/api/a1 tcp/8443 (IPv4): policy says allow, devices deny "
        "(nic:gpu3 ingress: deny (default-deny))",
        "acme/train/w2 -> globex/api/a1 tcp/8443 (IPv4): policy says allow, devices deny "
        "(nic:gpu3 ingress: deny (default-deny))"]
    assert verify(compiled, allowed) == found  # the candidate walk finds the same


def test_every_kind_of_corruption_is_caught() -> None:
    """Dropping any allow rule or a needed leak turns the check red."""
    rng = random.Random(7)
    base, allowed = compile_small()

    def red(device: str, change: object) -> bool:
        c, _ = compile_small()
        rs = c.devices[device]
        c.devices[device] = change(rs)  # type: ignore[operator]
        return bool(verify(c, allowed, exhaustive=True))

    def drop_allow(rs):  # type: ignore[no-untyped-def]
        allows = [r for r in rs.rules if r.action == "allow" and r.state != "established"]
        victim = rng.choice(allows)
        return dataclasses.replace(rs, rules=tuple(r for r in rs.rules if r != victim))

    def stray_allow(rs):  # type: ignore[no-untyped-def]
        extra = FlowRule(110, "egress", "", "*", "*", "tcp", ((1, 65535),), reasons=("corrupt",))
        return dataclasses.replace(rs, rules=(extra, *rs.rules))

    def drop_leak(rs):  # type: ignore[no-untyped-def]
        vrfs = tuple(v._replace(leaks=v.leaks[1:]) if v.tenant == "globex" else v for v in rs.vrfs)
        return dataclasses.replace(rs, vrfs=vrfs)

    def wrong_leak(rs):  # type: ignore[no-untyped-def]
        vrfs = tuple(v._replace(leaks=(*v.leaks, Leak("10.2.0.21/32", "vrf10002", ("corrupt",))))
                     if v.tenant == "acme" else v for v in rs.vrfs)
        return dataclasses.replace(rs, vrfs=vrfs)

    for device in ("nic:gpu1", "nic:gpu2", "nic:gpu3", "nic:gpu4", "leaf:leaf1", "leaf:leaf2"):
        for _ in range(3):
            assert red(device, drop_allow), device
    assert red("leaf:leaf2", drop_leak)
    # one device opening more than it should is caught by the others (defence in depth): no mismatch
    assert not red("nic:gpu1", stray_allow)
    assert not red("leaf:leaf1", wrong_leak)
    assert base.devices


def test_port_classes_cover_every_port_once() -> None:
    classes = port_classes([443, 444, 8000, 8004, 65535])
    assert classes[0] == (1, 442) and (443, 443) in classes and classes[-1] == (65535, 65535)
    assert sum(hi - lo + 1 for lo, hi in classes) == 65535
