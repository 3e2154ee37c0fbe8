"""Hypothesis strategies for whole fabrics: tenants, groups, workloads, placements, grants, quarantine,
revocation; small enough that the exhaustive equivalence walk stays fast."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st

from enforcer.fabric import Fabric, Grant, Group, Link, Node, Placement, Switch, Tenant, Workload

PORTS = (22, 53, 443, 4791, 5432, 5433, 8000, 8080, 8443)  # 4791: RoCEv2 (udp), stateless on a NIC
NOW = datetime(2027, 1, 15, tzinfo=UTC)
EXPIRED = datetime(2026, 1, 1, tzinfo=UTC)
LATER = datetime(2099, 1, 1, tzinfo=UTC)


@st.composite
def fabrics(draw: st.DrawFn, max_tenants: int = 3) -> Fabric:
    n_tenants = draw(st.integers(1, max_tenants))
    names = (["platform"] if draw(st.booleans()) else []) + [f"t{i}" for i in range(n_tenants)]
    tenants = []
    for i, slug in enumerate(names):
        v6 = (f"fd00:{i + 1}::/48",) if draw(st.booleans()) else ()
        tenants.append(Tenant(slug, 20_000 + i, 200 + i, (f"10.{i + 1}.0.0/16", *v6),
                              quarantined=draw(st.booleans()) and draw(st.booleans())))
    groups, workloads = [], []
    for t in tenants:
        for g in range(draw(st.integers(1, 3))):
            exposed: dict[str, list[int]] = {}
            for proto in ("tcp", "udp"):
                ports = draw(st.lists(st.sampled_from(PORTS), max_size=3, unique=True))
                if ports:
                    exposed[proto] = sorted(ports)
            groups.append(Group(t.slug, f"g{g}", tuple(sorted((p, tuple(v)) for p, v in exposed.items())),
                                quarantined=draw(st.integers(0, 9)) == 0))
            for w in range(draw(st.integers(0, 2))):
                workloads.append(Workload(t.slug, f"g{g}", f"w{w}", revoked=draw(st.integers(0, 7)) == 0))
    n_leaves = draw(st.integers(1, 2))
    n_nodes = draw(st.integers(1, 4))
    nodes = [Node(f"n{i}", ("p0",), tuple(f"vf{j}" for j in range(8))) for i in range(n_nodes)]
    leaves = [Switch(f"leaf{i}", "leaf", tuple(f"swp{j}" for j in range(1, 9))) for i in range(n_leaves)]
    links = [Link(f"leaf{i % n_leaves}", f"swp{i // n_leaves + 1}", f"n{i}", "p0", "node") for i in range(n_nodes)]
    placements = []
    used: dict[str, int] = {}
    by_tenant = {t.slug: (i, t) for i, t in enumerate(tenants)}
    for k, workload in enumerate(workloads):
        node = draw(st.integers(0, n_nodes - 1))
        port = used.get(f"n{node}", 0)
        used[f"n{node}"] = port + 1
        i, t = by_tenant[workload.tenant]
        ipv6 = f"fd00:{i + 1}::{k + 1:x}" if len(t.prefixes) > 1 and draw(st.booleans()) else None
        placements.append(Placement(workload.key, f"n{node}", f"vf{port}", f"10.{i + 1}.0.{k + 1}", ipv6))
    grants = []
    for k in range(draw(st.integers(0, 4))):
        if len(tenants) < 2:
            break
        a, b = draw(st.lists(st.sampled_from(groups), min_size=2, max_size=2, unique=True))
        if a.tenant == b.tenant:
            continue
        grants.append(Grant(f"gr{k}", a.tenant, a.name, b.tenant, b.name, draw(st.sampled_from(("tcp", "udp"))),
                            tuple(sorted(draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=2,
                                                       unique=True)))),
                            draw(st.sampled_from((LATER, LATER, EXPIRED)))))
    return Fabric("gen.test", tuple(tenants), tuple(groups), tuple(workloads), tuple(nodes), tuple(leaves),
                  tuple(links), tuple(placements), tuple(grants))
