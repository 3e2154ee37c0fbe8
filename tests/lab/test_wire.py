"""The policy on the wire, on the golden lab fabric (two tenants, a platform service, a grant; two leaves
behind a spine): real TCP connections between every ordered pair of workloads, on allowed and denied
ports, over IPv4 and IPv6, succeed exactly where the policy allows; the enforcer's equivalence walk of
the applied rule sets gives the same answer as the wire, connection by connection."""

from __future__ import annotations

from typing import Any

from enforcer.equivalence import Walker, verify
from lab import standalone
from lab.probe import Endpoint, endpoint, probe
from policy.decide import expand_allowed
from tests.lab.conftest import LAB, OPEN, GoldenLab, wire_answers

pytestmark = LAB
PORTS = (53, 443, 5432, 5433, 8443, 9999)  # every exposed port of the fabric and one nobody exposes


def _matrix(lab: GoldenLab) -> list[tuple[Endpoint, Endpoint, int, int]]:
    eps = [endpoint(lab.st, k) for k in sorted(lab.st["workloads"])]
    return [(s, d, port, fam) for s in eps for d in eps if s is not d for port in PORTS for fam in (4, 6)
            if (s.ipv4 if fam == 4 else s.ipv6) and (d.ipv4 if fam == 4 else d.ipv6)]


def _group(workload: str) -> str:
    return workload.rsplit("/", 1)[0]


def test_every_pair_connects_exactly_where_the_policy_allows(golden_lab: GoldenLab) -> None:
    items = _matrix(golden_lab)
    policy = {(f"{f.src_tenant}/{f.src_group}", f"{f.dst_tenant}/{f.dst_group}", f.port)
              for f in expand_allowed(golden_lab.allowed) if f.proto == "tcp"}
    wire = wire_answers(items, lambda s, d, port: (_group(s.workload), _group(d.workload), port) in policy)
    walker = Walker(standalone.installed(golden_lab.st, golden_lab.fabric))
    placement = golden_lab.fabric.placement
    wrong: list[Any] = []
    for (s, d, port, fam), ok in zip(items, wire, strict=True):
        want = (_group(s.workload), _group(d.workload), port) in policy
        enforcer, detail = walker.walk(placement[s.workload], placement[d.workload], fam, "tcp", port)
        if not ok == want == enforcer:
            wrong.append((s.workload, d.workload, port, fam, {"wire": ok, "policy": want, "enforcer": enforcer},
                          detail))
    assert wrong == []
    opened = {(s.workload, d.workload, port, fam) for (s, d, port, fam), ok in zip(items, wire, strict=True) if ok}
    # the matrix is not trivially one-sided: intra-tenant, the grant, the platform service, both families
    assert ("acme/train/w1", "acme/data/db1", 5432, 6) in opened
    assert ("acme/train/w2", "globex/api/a1", 8443, 4) in opened  # cross-tenant on one node, through the leaf
    assert ("globex/api/a1", "platform/dns/ns1", 53, 4) in opened
    assert ("globex/api/a1", "acme/train/w2", 443, 4) not in opened  # the grant is one way
    assert len(opened) < len(items) / 4


def test_the_equivalence_check_agrees_with_the_wire(golden_lab: GoldenLab) -> None:
    assert verify(golden_lab.compiled, golden_lab.allowed, exhaustive=True) == []


def test_a_probe_names_the_rule_that_decided(golden_lab: GoldenLab) -> None:
    inst = standalone.installed(golden_lab.st, golden_lab.fabric)
    ok = probe(golden_lab.st, inst, "acme/train/w1", "globex/api/a1", 8443, timeout=OPEN)
    assert ok.open and ok.agrees and ok.decided_by == ["grant:g-train-api"]
    devices = {m["device"] for m in ok.moved if "grant:g-train-api" in m["reasons"]}
    assert devices == {"nic:gpu1", "leaf:leaf1", "leaf:leaf2", "nic:gpu3"}  # every hop counted the grant
    blocked = probe(golden_lab.st, inst, "globex/batch/b1", "acme/data/db1", 5432, timeout=0.5)
    assert not blocked.open and blocked.agrees and blocked.seconds < 1.0
    assert blocked.decided_by == ["nic:gpu1 table 1 priority 0: deny (default-deny)"]
    six = probe(golden_lab.st, inst, "acme/data/db1", "acme/train/w1", 443, family=6, timeout=OPEN)
    assert six.open and six.decided_by == ["intra-tenant"]
