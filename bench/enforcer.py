"""Enforcer benchmark at 1,000 tenants x 10 groups, 10,000 workloads on 1,000 nodes behind 50 leaves, 5,000 grants.

The allowed-flows input comes from the shipped policy (rego/flows.rego) through the embedded regorus engine,
as bench/policy.py does. Figures (medians of --runs), each beside a baseline measured in the same run:
  - full compile (all 1,050 devices) vs raw regorus evaluation of data.flows.allowed_flows   (goal <= 2 s)
  - incremental recompile after one grant is added / revoked vs the full compile          (goal <= 50 ms)
  - flows after aggregation and conjunctions vs the naive one-flow-per-pair count (SuperNICs; switch ACLs)
  - equivalence check of every allowed flow and every flow a NIC rule could admit vs policy.decide's
    expand_allowed over the same set (the least work that lists the allowed pairs)
  - rule-set content hashing (canonical JSON + SHA-256) vs raw hashlib over the same bytes, and vs the
    generic path (to_dict + sorted-key json.dumps) once
Timed figures are printed twice: wall time, and CPU time of this process (time.process_time) beside the
baseline's CPU time: on a shared machine the wall time follows the load, the CPU time much less.

  - the persisted path (SQLite, the stored fabric, the shipped policy active): time from a grant approval's
    commit to the new versions published by the reconciler (median and p99 of --approvals), beside the pure
    incremental recompile inside the same runs; and the first publication of every device

Run: .venv/bin/python bench/enforcer.py [--tenants 1000 --groups 10 --nodes 1000 --leaves 50 --grants 5000]
     [--approvals 20] [--no-db | --db-only]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import regorus  # noqa: E402

from bench.progress import Progress  # noqa: E402
from enforcer.compiler import Budget, compile_fabric, recompile  # noqa: E402
from enforcer.equivalence import verify  # noqa: E402
from enforcer.fabric import (  # noqa: E402
    Fabric,
    Grant,
    Group,
    Link,
    Node,
    Placement,
    Switch,
    Tenant,
    Workload,
    policy_data,
    revoked_ids,
)
from enforcer.render.nvue import acl_rules  # noqa: E402
from enforcer.render.openflow import render_flows  # noqa: E402
from policy.decide import ALLOWED_FLOWS_QUERY, expand_allowed  # noqa: E402
from policy.engines.embedded import new_engine  # noqa: E402
from policy.versions import load_dir  # noqa: E402

FAR = datetime(2099, 1, 1, tzinfo=UTC)
NOW_NS = 1_800_000_000 * 10**9


def build_fabric(tenants: int, groups: int, nodes: int, leaves: int, grants: int, seed: int = 1) -> Fabric:
    rng = random.Random(seed)
    ts, gs, ws, ps = [], [], [], []
    node_names = [f"gpu{i:04d}" for i in range(nodes)]
    slots = [(n, f"pf0vf{j}") for j in range(16) for n in node_names]
    rng.shuffle(slots)
    k = 0
    for i in range(tenants):
        name = "platform" if i == 0 else f"t{i:04d}"
        ts.append(Tenant(name, 10_000 + i, 100 + i, (f"10.{i // 16}.{(i % 16) * 16}.0/20",),
                         quarantined=i % 97 == 5))
        n_groups, per_group = (2, 5) if i == 0 else (groups, 1)
        for j in range(n_groups):
            exposed = (("tcp", (53,)), ("udp", (53,))) if i == 0 and j == 0 else (("tcp", tuple(sorted({443,
                                                                                                    8000 + j}))),)
            gs.append(Group(name, f"g{j}", exposed, quarantined=j == 7 and i % 13 == 0))
            for w in range(per_group):
                ws.append(Workload(name, f"g{j}", f"w{w}"))
                node, port = slots[k]
                host = j * per_group + w + 1
                base = (i // 16, (i % 16) * 16)
                ps.append(Placement(ws[-1].key, node, port, f"10.{base[0]}.{base[1] + host // 256}.{host % 256}"))
                k += 1
    leaf_names = [f"leaf{i:02d}" for i in range(leaves)]
    per_leaf = -(-nodes // leaves)
    switches = [Switch(name, "leaf", (*(f"swp{j}" for j in range(1, per_leaf + 1)), "swp63", "swp64"))
                for name in leaf_names]
    switches += [Switch("spine1", "spine", tuple(f"swp{j}" for j in range(1, leaves + 1))),
                 Switch("spine2", "spine", tuple(f"swp{j}" for j in range(1, leaves + 1)))]
    links = [Link(leaf_names[i // per_leaf], f"swp{i % per_leaf + 1}", n, "p0", "node")
             for i, n in enumerate(node_names)]
    links += [Link(leaf, port, spine, f"swp{i + 1}", "spine") for i, leaf in enumerate(leaf_names)
              for port, spine in (("swp63", "spine1"), ("swp64", "spine2"))]
    nodes_t = tuple(Node(n, ("p0",), tuple(f"pf0vf{j}" for j in range(16))) for n in node_names)
    names = [t.slug for t in ts if t.slug != "platform"]
    gr = []
    for g in range(grants):
        src, dst = rng.sample(names, 2)
        gr.append(Grant(f"gr{g:05d}", src, f"g{rng.randrange(groups)}", dst, f"g{rng.randrange(groups)}", "tcp",
                        (443,), FAR))
    return Fabric("bench.example", tuple(ts), tuple(gs), tuple(ws), nodes_t, tuple(switches), tuple(links),
                  tuple(ps), tuple(gr))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result); the CPU seconds of the same call go to cpu_of()."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall = time.perf_counter() - start
    LAST_CPU.append(time.process_time() - cpu)
    return wall, out


LAST_CPU: list[float] = []  # CPU seconds of every timed() call, in order


def cpu_since(mark: int) -> list[float]:
    """CPU seconds of the timed() calls made since len(LAST_CPU) was `mark`."""
    return LAST_CPU[mark:]


def line(figure: str, value: float, unit: str, base: float, base_unit: str | None = None, note: str = "") -> None:
    ratio = value / base if base else float("inf")
    print(f"{figure}: {value:.4g} {unit} (baseline {base:.4g} {base_unit or unit}, ratio {ratio:.3g}){note}",
          flush=True)


def goal(figure: str, value: float, unit: str, limit: float) -> None:
    line(figure, value, unit, limit, note=" goal met" if value <= limit else " goal NOT met")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--leaves", type=int, default=50)
    ap.add_argument("--grants", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--approvals", type=int, default=20, help="grant approvals timed on the persisted path")
    ap.add_argument("--no-db", action="store_true", help="skip the persisted path")
    ap.add_argument("--db-only", action="store_true", help="only the persisted path (its baseline is measured "
                                                           "inside it)")
    args = ap.parse_args()
    med = statistics.median
    progress = Progress("enforcer")
    progress.step("building the fabric, evaluating allowed_flows")
    fabric = build_fabric(args.tenants, args.groups, args.nodes, args.leaves, args.grants)
    print(f"scale: {len(fabric.tenants)} tenants, {len(fabric.groups)} groups, {len(fabric.workloads)} workloads on "
          f"{len(fabric.nodes)} nodes behind {len(fabric.leaves)} leaves, {len(fabric.grants)} grants, "
          f"runs {args.runs}", flush=True)
    if args.db_only:
        persisted_path(fabric, args.approvals)
        return

    doc = policy_data(fabric)
    doc["tf"]["now_ns"] = NOW_NS
    raw = new_engine(load_dir(ROOT / "rego"))
    raw.add_data_json(json.dumps(doc))
    raw.set_input_json("{}")
    mark = len(LAST_CPU)
    rego_times, texts = zip(*(timed(lambda: raw.eval_rule_as_json(ALLOWED_FLOWS_QUERY)) for _ in range(args.runs)),
                            strict=True)
    rego_cpu = cpu_since(mark)
    allowed = json.loads(texts[0])
    revoked = revoked_ids(fabric)
    budget = Budget()  # the defaults: 65,536 NIC flows; 36,000 switch ACL entries, halved by atomic mode

    compile_times = []
    compiled = None
    progress.step("full compiles")
    mark = len(LAST_CPU)
    for _ in range(args.runs):
        fabric = build_fabric(args.tenants, args.groups, args.nodes, args.leaves, args.grants)  # cold indexes
        gc.collect()  # each compile starts from the same heap, not the previous compile's garbage
        t, compiled = timed(lambda f=fabric: compile_fabric(f, allowed, revoked, budget))
        compile_times.append(t)
    compile_cpu = cpu_since(mark)
    assert compiled is not None
    print(f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)", flush=True)
    line(f"full compile, {len(compiled.devices)} devices from {len(allowed)} allowed_flows entries "
         "(vs raw regorus allowed_flows)", med(compile_times), "s", med(rego_times))
    line("full compile, CPU time (vs raw regorus allowed_flows, CPU time)", med(compile_cpu), "s", med(rego_cpu))
    goal("full compile vs goal", med(compile_times), "s", 2.0)
    goal("full compile, CPU time vs goal", med(compile_cpu), "s", 2.0)

    # A full compile leaves millions of young objects (it runs with the cyclic GC paused); the first
    # collections after it move them to the old generation once. Done here, untimed, so the recompile
    # figures show the steady state a long-running server sees, not that one-off.
    gc.collect()

    # one grant added, then revoked: the entry the policy would add for it
    src, dst = "t0001", "t0002"
    extra = {"dst_tenant": dst, "dst_group": "g2", "proto": "tcp", "ports": [9443], "reason": "grant:bench-new",
             "sources": [f"{src}/g1"]}
    progress.step("incremental recompiles")
    added_t, removed_t, touched = [], [], []
    added_c, removed_c = [], []
    state = compiled
    for _ in range(max(5, args.runs)):
        t, grown = timed(lambda s=state: recompile(s, [*allowed, extra]))
        added_t.append(t)
        added_c.append(LAST_CPU[-1])
        touched.append(len(grown.recompiled))
        t, state = timed(lambda g=grown: recompile(g, allowed))
        removed_t.append(t)
        removed_c.append(LAST_CPU[-1])
    assert {d: rs.canonical for d, rs in state.devices.items()} == {
        d: rs.canonical for d, rs in compiled.devices.items()}
    line(f"incremental recompile, one grant added ({med(touched):.0f} devices touched, vs full compile)",
         med(added_t) * 1e3, "ms", med(compile_times) * 1e3)
    line("incremental recompile, one grant revoked (vs full compile)", med(removed_t) * 1e3, "ms",
         med(compile_times) * 1e3)
    line("incremental recompile, one grant added, CPU time (vs full compile, CPU time)", med(added_c) * 1e3, "ms",
         med(compile_cpu) * 1e3)
    line("incremental recompile, one grant revoked, CPU time (vs full compile, CPU time)", med(removed_c) * 1e3,
         "ms", med(compile_cpu) * 1e3)
    goal("incremental recompile, one grant added vs goal", med(added_t) * 1e3, "ms", 50.0)
    goal("incremental recompile, one grant revoked vs goal", med(removed_t) * 1e3, "ms", 50.0)
    goal("incremental recompile, one grant added, CPU time vs goal", med(added_c) * 1e3, "ms", 50.0)
    goal("incremental recompile, one grant revoked, CPU time vs goal", med(removed_c) * 1e3, "ms", 50.0)

    # flows after aggregation and conjunctions vs one flow per allowed (src workload, dst workload, port)
    expand_t, flows = timed(lambda: expand_allowed(allowed))
    members: dict[str, int] = {}
    for p in fabric.placements:
        g = p.workload.rsplit("/", 1)[0]
        members[g] = members.get(g, 0) + 1
    pairs = sum(members.get(f"{f.src_tenant}/{f.src_group}", 0) * members.get(f"{f.dst_tenant}/{f.dst_group}", 0)
                for f in flows)
    render_t, nic_flows = timed(lambda: sum(len(render_flows(rs)) for rs in compiled.devices.values()
                                            if rs.kind == "nic"))
    nic_allow = sum(1 for rs in compiled.devices.values() if rs.kind == "nic"
                    for f in render_flows(rs) if f.table in (1, 2) and f.priority >= 100)
    line("SuperNIC allow flows after aggregation + conjunctions (vs naive: one egress + one ingress flow per "
         "allowed workload pair and port)", nic_allow, "flows", 2 * pairs)
    line("SuperNIC flows in all, with classification and forwarding (vs naive allow flows)", nic_flows, "flows",
         2 * pairs)
    acl = 0
    for rs in compiled.devices.values():
        if rs.kind == "leaf":
            by_scope: dict[str, list[Any]] = {}
            for r in rs.rules:
                by_scope.setdefault(r.scope, []).append(r)
            acl += sum(len(acl_rules(rules, rs.set_by_name, fam)) for rules in by_scope.values() for fam in (4, 6))
    line("switch ACL entries, all leaves (vs naive: one forward + one return entry per allowed pair and port)",
         acl, "entries", 2 * pairs)
    worst = max((rs for rs in compiled.devices.values()), key=lambda rs: rs.cost / budget.limit(rs.kind))
    line(f"fullest device {worst.device}: budget use", worst.cost, "entries", budget.limit(worst.kind))
    line("rendering every SuperNIC's OpenFlow (vs full compile)", render_t, "s", med(compile_times))

    verify_t = []
    mismatches: list[Any] = []
    for _ in range(args.runs):
        t, mismatches = timed(lambda: verify(compiled, allowed))
        verify_t.append(t)
    assert mismatches == [], mismatches[:5]
    line(f"equivalence check, {pairs} allowed workload flows and every NIC-admissible flow, 0 mismatches "
         "(vs expand_allowed)", med(verify_t), "s", expand_t)

    blobs = [rs.canonical for rs in compiled.devices.values()]
    hash_t, hash_c = [], []
    raw_t, raw_c = [], []
    for _ in range(args.runs):
        fresh = [type(rs).from_dict(rs.to_dict()) for rs in compiled.devices.values()]  # nothing cached
        hash_t.append(timed(lambda fr=fresh: [rs.content_hash for rs in fr])[0])
        hash_c.append(LAST_CPU[-1])
        raw_t.append(timed(lambda: [hashlib.sha256(b).hexdigest() for b in blobs])[0])
        raw_c.append(LAST_CPU[-1])
    mb = sum(map(len, blobs)) / 1e6
    line(f"content hash of every rule set, {mb:.1f} MB canonical JSON (vs raw hashlib)", med(hash_t), "s",
         med(raw_t))
    line("content hash of every rule set, CPU time (vs raw hashlib, CPU time)", med(hash_c), "s", med(raw_c))
    again = [type(rs).from_dict(rs.to_dict()) for rs in compiled.devices.values()]
    generic_t, generic = timed(lambda: [hashlib.sha256(json.dumps(rs.to_dict(), sort_keys=True, separators=(",", ":"),
                                                                  ensure_ascii=False).encode()).hexdigest()
                                        for rs in again])
    assert generic == [rs.content_hash for rs in compiled.devices.values()]
    line("content hash of every rule set (vs the generic path, once: to_dict + sorted-key json.dumps + SHA-256)",
         med(hash_t), "s", generic_t)
    line("content hash of every rule set, CPU time (vs the generic path, once, CPU time)", med(hash_c), "s",
         LAST_CPU[-1])
    _ = regorus
    if not args.no_db:
        persisted_path(fabric, args.approvals)


def fabric_document(fabric: Fabric) -> dict[str, Any]:
    """The bench fabric as a fabric document (what `trustfabric fabric import` reads), grants left out."""
    return {
        "trust_domain": fabric.trust_domain,
        "tenants": {t.slug: {"vni": t.vni, "vlan": t.vlan, "prefixes": list(t.prefixes)} for t in fabric.tenants},
        "groups": {g.key: {"ports": [f"{p}/{n}" for p, ns in g.exposed for n in ns]} for g in fabric.groups},
        "workloads": {w.key: None for w in fabric.workloads},
        "nodes": {n.name: {"nic": {"uplinks": list(n.uplinks), "host_ports": list(n.host_ports)}}
                  for n in fabric.nodes},
        "leaves": {s.name: {"ports": list(s.ports)} for s in fabric.leaves},
        "spines": {s.name: {"ports": list(s.ports)} for s in fabric.spines},
        "links": [[f"{x.leaf}:{x.leaf_port}", f"{x.peer}:{x.peer_port}"] for x in fabric.links],
        "placements": {p.workload: {"node": p.node, "port": p.port, "ipv4": p.ipv4} for p in fabric.placements},
    }


def persisted_path(fabric: Fabric, approvals: int) -> None:
    """Grant approval commit -> new versions published, through the database, at the bench scale."""
    import shutil
    import tempfile
    from dataclasses import replace as dc_replace
    from datetime import timedelta

    from audit import Actor
    from audit.checkpoint import ensure_audit_key
    from core.clock import FrozenClock
    from keys.store import KeyKind
    from pki.service import init_trust_domain
    from policy import service as policy_service
    from policy.grant_decider import RegoGrantDecider
    from policy.grants import Caller, approve_grant
    from policy.models import Grant as GrantRow
    from workflows.context import AppContext
    from workflows.enforcement import make_reconciler
    from workflows.fabric import Who, import_fabric
    from workflows.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-enforcer-"))
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    ctx = AppContext.open(Settings(home=tmp / "home", trust_domain=fabric.trust_domain), create=True, clock=clock)
    try:
        admin = Actor("bench", "admin")
        with ctx.db.session() as s:
            init_trust_domain(s, ctx.keystore, trust_domain=fabric.trust_domain, key_kind=KeyKind.EC_P256,
                              clock=clock)
        ensure_audit_key(ctx.keystore)
        t, _ = timed(lambda: _in_session(ctx, lambda s: import_fabric(s, Who(admin, clock), ctx.settings.pools(),
                                                                       fabric_document(fabric), source="bench")))
        print(f"(persisted path setup: fabric import of {len(fabric.placements)} placements in {t:.1f} s)",
              flush=True)
        pending = []
        with ctx.db.session() as s:
            for g in fabric.grants:
                s.add(_grant_row(GrantRow, g.id, g, "active", clock(), FAR))
            names = sorted(t.slug for t in fabric.tenants if t.slug != "platform" and not t.quarantined)
            for i in range(approvals):
                src, dst = names[(2 * i) % len(names)], names[(2 * i + 1) % len(names)]
                row = _grant_row(GrantRow, f"gp{i:04d}", dc_replace(fabric.grants[0], src_tenant=src, dst_tenant=dst,
                                                                     src_group="g1", dst_group="g2",
                                                                     ports=(8002,)),
                                 "pending", clock(), None)
                row.required_approvers = [f"tenant-admin:{dst}"]
                row.pending_until = clock() + timedelta(days=1)
                s.add(row)
                pending.append((row.id, dst))
        from policy.shipped import REGO_DIR
        from policy.versions import load_dir

        with ctx.db.session() as s:
            v, _ = policy_service.upload(s, policy_service.prepare(load_dir(REGO_DIR)), admin, now=clock())
            policy_service.activate(s, v.number or 0, admin, now=clock())
        rec = make_reconciler(ctx)
        first_t, first = timed(lambda: rec.run_once("bench start"))
        assert first.error is None, first.error
        line(f"persisted path: first publication of all {len(first.published)} devices (compile, plan, store, "
             "audit; vs its full compile)", first_t, "s", first.compile_seconds)
        gc.collect()
        decide = RegoGrantDecider()
        latency, pure, touched = [], [], []
        for gid, dst in pending:
            caller = Caller(f"{dst}-admin", "tenant-admin", dst, Actor(f"{dst}-admin", "tenant", dst))
            with ctx.db.session() as s:
                approve_grant(s, gid, caller=caller, clock=clock, decide=decide)
            committed = time.perf_counter()
            out = rec.run_once("bench approval")
            latency.append(time.perf_counter() - committed)
            assert out.error is None and out.published, out
            pure.append(out.compile_seconds)
            touched.append(len(out.published))
        latency.sort()
        p99 = latency[min(len(latency) - 1, int(len(latency) * 0.99))]
        line(f"persisted path: grant approval commit -> new versions published, median of {len(latency)} "
             f"({med(touched):.0f} devices each; vs the pure incremental recompile in the same runs)",
             statistics.median(latency) * 1e3, "ms", statistics.median(pure) * 1e3)
        line(f"persisted path: p99 of {len(latency)} approvals (vs pure recompile p99)", p99 * 1e3, "ms",
             sorted(pure)[min(len(pure) - 1, int(len(pure) * 0.99))] * 1e3)
        rec.close()
    finally:
        ctx.close()
        shutil.rmtree(tmp, ignore_errors=True)


def med(values: list[float] | list[int]) -> float:
    return float(statistics.median(values))


def _in_session(ctx: Any, fn: Callable[[Any], Any]) -> Any:
    with ctx.db.session() as s:
        return fn(s)


def _grant_row(cls: Any, gid: str, g: Grant, state: str, now: datetime, expires: datetime | None) -> Any:
    return cls(id=gid, src_tenant=g.src_tenant, src_group=g.src_group, dst_tenant=g.dst_tenant, dst_group=g.dst_group,
               proto=g.proto, ports=list(g.ports), ttl_seconds=3600, state=state, requested_by="bench",
               requester_tenant="", required_approvers=[], approvals=[], reasons=[], created_at=now,
               decided_at=now if expires else None, expires_at=expires)


if __name__ == "__main__":
    main()
