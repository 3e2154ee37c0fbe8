"""Policy engine benchmark at 1,000 tenants x 10 groups x 5,000 grants.

Figures (medians of several runs), each beside a baseline measured in the same run:
  - one flow decision through PolicyEngine vs raw regorus evaluation of the same query (p50, p99, rate)
  - the full allowed_flows set through PolicyEngine vs raw regorus
  - the same through `trustfabric pdp` over HTTP (OPA engine) vs embedded
  - data reload after one grant change (incremental) vs a full reload
  - the hot decisions (flows, grants, api_authz) through PolicyEngine with regorus's compiled VM
    (policy/engines/rvm.py) vs the raw interpreter vs the raw VM, and the VM's whole-document data load
  - the consistency check of a candidate (policy/consistency.py: decision vs allowed_flows on the diff and the
    samples) for the shipped policy against itself and for an extra platform port, vs the candidate's allowed
    set (what an impact report evaluates anyway); and the impact report with the check vs without

Run: .venv/bin/python bench/policy.py [--tenants 1000 --groups 10 --grants 5000 --runs 3] [--only-vm]
     [--only-consistency]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import regorus  # noqa: E402
import uvicorn  # noqa: E402

from bench.api import percentile  # noqa: E402
from bench.progress import Progress  # noqa: E402
from pdp.server import create_pdp_app  # noqa: E402
from policy.decide import ALLOWED_FLOWS_QUERY, AUTHZ_QUERY, FLOW_QUERY, GRANT_QUERY, sync_data  # noqa: E402
from policy.engines import diff_documents  # noqa: E402
from policy.engines.embedded import RegorusEngine, new_engine  # noqa: E402
from policy.engines.opa_server import OpaServerEngine, OpaSettings  # noqa: E402
from policy.engines.rvm import Accelerator  # noqa: E402
from policy.versions import load_dir  # noqa: E402

FAR_NS = 9_999_999_999 * 10**9


def build_doc(tenants: int, groups: int, grants: int, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    ts: dict[str, Any] = {}
    for i in range(tenants):
        name = "platform" if i == 0 else f"t{i:04d}"
        n = 3 if i == 0 else groups
        ts[name] = {"quarantined": i % 97 == 5, "groups": {}}
        for j in range(n):
            ts[name]["groups"][f"g{j}"] = {
                "labels": {"app": f"app{j}"}, "exposed": {"tcp": sorted({443, 8000 + j})},
                "sensitivity": "sensitive" if j == 9 else "normal", "quarantined": j == 7 and i % 13 == 0,
            }
    names = [n for n in ts if n != "platform"]
    nested: dict[str, Any] = {}
    for k in range(grants):
        src, dst = rng.sample(names, 2)
        nested.setdefault(src, {}).setdefault(dst, {})[f"gr{k:05d}"] = {
            "src_group": f"g{rng.randrange(groups)}", "dst_group": f"g{rng.randrange(groups)}", "proto": "tcp",
            "ports": [443], "expires_at_ns": FAR_NS,
        }
    return {"tf": {"tenants": ts, "grants": nested, "revoked": {}, "now_ns": 1_800_000_000 * 10**9}}


def inputs(doc: dict[str, Any], n: int, seed: int = 2) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tf = doc["tf"]
    names = [t for t in tf["tenants"] if t != "platform"]
    grant_list = [(s, d, g) for s, by in tf["grants"].items() for d, ids in by.items() for g in ids.values()]
    out = []
    for k in range(n):
        kind = k % 4
        if kind == 0:  # intra-tenant
            t = rng.choice(names)
            out.append({"src": {"tenant": t, "group": "g1"}, "dst": {"tenant": t, "group": "g2"},
                        "proto": "tcp", "port": 443})
        elif kind == 1:  # granted
            s, d, g = rng.choice(grant_list)
            out.append({"src": {"tenant": s, "group": g["src_group"]}, "dst": {"tenant": d, "group": g["dst_group"]},
                        "proto": "tcp", "port": 443})
        elif kind == 2:  # cross-tenant, no grant
            s, d = rng.sample(names, 2)
            out.append({"src": {"tenant": s, "group": "g3"}, "dst": {"tenant": d, "group": "g4"},
                        "proto": "tcp", "port": 8004})
        else:  # platform
            out.append({"src": {"tenant": rng.choice(names), "group": "g0"}, "dst": {"tenant": "platform",
                        "group": "g1"}, "proto": "tcp", "port": 443})
    return out


def grant_inputs(doc: dict[str, Any], n: int, seed: int = 3) -> list[dict[str, Any]]:
    """Grant requests as POST /v1/grants makes them: mostly pending, some denied (port not exposed, quarantined)."""
    rng = random.Random(seed)
    names = [t for t in doc["tf"]["tenants"] if t != "platform"]
    out = []
    for k in range(n):
        s, d = rng.sample(names, 2)
        port = 443 if k % 3 else 9999
        out.append({"requester": {"tenant": s}, "src": {"tenant": s, "group": f"g{rng.randrange(3)}"},
                    "dst": {"tenant": d, "group": f"g{rng.randrange(9)}"}, "proto": "tcp", "ports": [port],
                    "ttl_seconds": 3600})
    return out


def authz_inputs(doc: dict[str, Any], n: int, seed: int = 4) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    names = [t for t in doc["tf"]["tenants"] if t != "platform"]
    roles = ["tenant-admin", "tenant-member", "security", "auditor", "admin", "node"]
    actions = ["grant.create", "grant.read", "grant.approve", "policy.activate", "audit.read", "svid.issue"]
    out = []
    for _ in range(n):
        t = rng.choice(names)
        out.append({"principal": {"id": "p", "role": rng.choice(roles), "tenant": t}, "action": rng.choice(actions),
                    "resource": {"tenant": t if rng.random() < 0.8 else rng.choice(names)}})
    return out


def vm_figures(args: argparse.Namespace, modules: dict[str, str], doc: dict[str, Any],
               flows: list[dict[str, Any]]) -> None:
    """Each hot decision three ways, in the same run: the PolicyEngine with the VM (what the API runs), the raw
    regorus interpreter (eval_rule_as_json, what the engine did before), the raw VM (Rvm.execute_entry_point)."""
    policy = {p: text for p, text in modules.items() if not p.endswith("_test.rego")}  # as the grant decider loads
    fast = RegorusEngine(policy, doc, accelerator=Accelerator())
    fast.warm()
    slow = RegorusEngine(policy, doc)  # the interpreter only (TRUSTFABRIC_REGO_VM=off)
    slow.warm()
    interp = new_engine(policy)
    interp.add_data_json(json.dumps(doc))
    text = json.dumps(doc)
    program = regorus.Program.compile_from_modules("{}", sorted(policy.items()), [FLOW_QUERY, GRANT_QUERY, AUTHZ_QUERY])
    vm = regorus.Rvm()
    vm.load_program(program)
    vm.set_data_json(text)
    med = statistics.median
    n = min(args.decisions, 1000)
    for name, query, batch in (("flows", FLOW_QUERY, flows[:n]), ("grants", GRANT_QUERY, grant_inputs(doc, n)),
                               ("api_authz", AUTHZ_QUERY, authz_inputs(doc, n))):
        texts = [json.dumps(i) for i in batch]
        for i, s in zip(batch[:20], texts[:20], strict=True):  # warm all four
            fast.evaluate(query, i)
            slow.evaluate(query, i)
            interp.set_input_json(s)
            interp.eval_rule_as_json(query)
            vm.set_input_json(s)
            vm.execute_entry_point(query)
        e50, e99, i50, i99, v50, v99, s50 = [], [], [], [], [], [], []
        for _ in range(args.runs):
            t_e: list[float] = []
            t_i: list[float] = []
            t_v: list[float] = []
            t_s: list[float] = []
            for i, s in zip(batch, texts, strict=True):
                ts = time.perf_counter()
                slow.evaluate(query, i)
                t_s.append(time.perf_counter() - ts)
                t0 = time.perf_counter()
                fast.evaluate(query, i)
                t1 = time.perf_counter()
                interp.set_input_json(s)
                json.loads(interp.eval_rule_as_json(query))
                t2 = time.perf_counter()
                vm.set_input_json(s)
                json.loads(vm.execute_entry_point(query))
                t3 = time.perf_counter()
                t_e.append(t1 - t0)
                t_i.append(t2 - t1)
                t_v.append(t3 - t2)
            for out, samples in ((e50, t_e), (i50, t_i), (v50, t_v), (s50, t_s)):
                out.append(percentile(samples, 0.5))
            for out, samples in ((e99, t_e), (i99, t_i), (v99, t_v)):
                out.append(percentile(samples, 0.99))
        line(f"{name} decision p50 (PolicyEngine with VM vs raw interpreter)", med(e50) * 1e6, "us", med(i50) * 1e6)
        line(f"{name} decision p99 (PolicyEngine with VM vs raw interpreter)", med(e99) * 1e6, "us", med(i99) * 1e6)
        line(f"{name} decision p50 (raw VM vs raw interpreter)", med(v50) * 1e6, "us", med(i50) * 1e6)
        line(f"{name} decision p50 (PolicyEngine with VM vs raw VM)", med(e50) * 1e6, "us", med(v50) * 1e6)
        line(f"{name} decision p50 (PolicyEngine with VM vs PolicyEngine, VM off)", med(e50) * 1e6, "us",
             med(s50) * 1e6)
    stats = fast.accelerator.stats() if fast.accelerator is not None else {}
    answered = stats.get("vm_answers", 0)
    fallbacks = sum(stats.get(k, 0) for k in ("vm_errors", "undefined_values", "not_compiled", "stale_data"))
    line("decisions the interpreter answered instead of the VM (vs the VM's)", fallbacks, "decisions", answered)
    # grants activated while deciding: each change makes the VM's data stale; the interpreter answers until its
    # extra cost has paid for a reload (rvm.py). Mean cost per decision, patches included, VM on vs off.
    grants = grant_inputs(doc, 1000, seed=5)
    for every in (10, 100, 1000):
        per: dict[str, list[float]] = {"on": [], "off": []}
        for run in range(args.runs):
            for label, engine in (("on", fast), ("off", slow)):
                start = time.perf_counter()
                for k, request in enumerate(grants):
                    if k % every == 0:
                        src, dst = request["src"]["tenant"], request["dst"]["tenant"]
                        engine.patch_data([{"op": "add", "path": f"/tf/grants/{src}/{dst}/bench{run}x{every}x{k}",
                                            "value": {"src_group": "g1", "dst_group": "g2", "proto": "tcp",
                                                      "ports": [443], "expires_at_ns": FAR_NS}}]
                                          if dst in engine.data()["tf"]["grants"].get(src, {}) else
                                          [{"op": "add", "path": f"/tf/grants/{src}/{dst}",
                                            "value": {f"bench{run}x{every}x{k}": {
                                                "src_group": "g1", "dst_group": "g2", "proto": "tcp", "ports": [443],
                                                "expires_at_ns": FAR_NS}}}]
                                          if src in engine.data()["tf"]["grants"] else
                                          [{"op": "add", "path": f"/tf/grants/{src}", "value": {dst: {
                                              f"bench{run}x{every}x{k}": {
                                                  "src_group": "g1", "dst_group": "g2", "proto": "tcp", "ports": [443],
                                                  "expires_at_ns": FAR_NS}}}}])
                    engine.evaluate(GRANT_QUERY, request)
                per[label].append((time.perf_counter() - start) / len(grants))
        line(f"grant decision, one grant activated every {every} decisions, mean incl. reloads (VM on vs off)",
             med(per["on"]) * 1e6, "us", med(per["off"]) * 1e6)
    loads = [timed(lambda: vm.set_data_json(text)) for _ in range(max(3, args.runs))]
    reparse = [timed(lambda: new_engine(policy).add_data_json(text)) for _ in range(max(3, args.runs))]
    line("VM data load, whole document (set_data_json vs interpreter add_data_json)", med(loads) * 1e3, "ms",
         med(reparse) * 1e3)


def extra_platform_port(modules: dict[str, str]) -> dict[str, str]:
    """The shipped policy with port 9153 added to every platform service in allowed_flows only (a disagreement
    on every flow it opens)."""
    old = "\tsome proto, ports in groups[dg].exposed\n\tports != []\n]\n\n# An unexpired"
    new = ("\tsome proto, exposed_ports in groups[dg].exposed\n\tports := array.concat(exposed_ports, [9153])\n"
           "\tports != []\n]\n\n# An unexpired")
    assert old in modules["flows.rego"]
    return {**modules, "flows.rego": modules["flows.rego"].replace(old, new)}


def _report_without_check(cand: dict[str, str], modules: dict[str, str], doc: dict[str, Any], now: int) -> Any:
    """The impact report as it was computed before the consistency check: two answers and report_of."""
    from policy.impact import answer_under, report_of

    return report_of("c", "b", answer_under(modules, doc, now), answer_under(cand, doc, now))


def consistency_figures(args: argparse.Namespace, modules: dict[str, str], doc: dict[str, Any]) -> None:
    """What the consistency check adds: the check alone on a loaded engine (vs the candidate's allowed set on the
    same engine), and the whole impact report with it (policy.impact.checked_report) vs without (two answers
    and report_of, as before the check)."""
    from policy.consistency import check
    from policy.impact import answer_under, checked_report, opened_closed

    now = doc["tf"]["now_ns"]
    before = answer_under(modules, doc, now)
    for label, cand in (("shipped vs itself", modules), ("extra platform port", extra_platform_port(modules))):
        engine = RegorusEngine(cand, doc)
        try:
            after = engine.evaluate(ALLOWED_FLOWS_QUERY, {"now_ns": now})
            opened, closed = opened_closed(before, after)
            result = check(engine, after, opened, closed, doc, now)
            alone = [timed(partial(check, engine, after, opened, closed, doc, now)) for _ in range(args.runs)]
            answer = [timed(partial(engine.evaluate, ALLOWED_FLOWS_QUERY, {"now_ns": now})) for _ in range(args.runs)]
        finally:
            engine.close()
        med = statistics.median
        line(f"consistency check, {label} ({result.checked} decisions, diff {result.diff_checked} of "
             f"{result.diff_total}, {len(result.disagreements)} disagreements) vs the candidate's allowed set",
             med(alone), "s", med(answer))
        with_check = [timed(partial(checked_report, cand, "c", modules, "b", None, doc, now))
                      for _ in range(args.runs)]
        without = [timed(partial(_report_without_check, cand, modules, doc, now)) for _ in range(args.runs)]
        line(f"impact report with the consistency check, {label} (vs without)", med(with_check), "s", med(without))


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def percentiles(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 0.5), percentile(samples, 0.99)


def line(figure: str, value: float, unit: str, base: float, base_unit: str | None = None) -> None:
    ratio = value / base if base else float("inf")
    print(f"{figure}: {value:.4g} {unit} (baseline {base:.4g} {base_unit or unit}, ratio {ratio:.2f})", flush=True)


def serve(engine: RegorusEngine) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(create_pdp_app(engine), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--grants", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--only-vm", action="store_true", help="only the compiled VM's figures")
    ap.add_argument("--only-consistency", action="store_true", help="only the consistency check's figures")
    args = ap.parse_args()
    progress = Progress("policy")
    progress.step("building the data document")
    modules = load_dir(ROOT / "rego")
    doc = build_doc(args.tenants, args.groups, args.grants)
    print(f"scale: {args.tenants} tenants x {args.groups} groups, {args.grants} grants, runs {args.runs}", flush=True)

    if args.only_vm:
        progress.step("hot decisions through the compiled VM")
        vm_figures(args, modules, doc, inputs(doc, args.decisions))
        return
    if args.only_consistency:
        progress.step("the consistency check")
        consistency_figures(args, modules, doc)
        return
    engine = RegorusEngine(modules, doc)
    raw = new_engine(modules)
    raw.add_data_json(json.dumps(doc))
    batch = inputs(doc, args.decisions)
    texts = [json.dumps(i) for i in batch]
    engine.evaluate(FLOW_QUERY, batch[0])  # warm this thread's engine

    ours_p50, ours_p99, raw_p50, raw_p99, ours_rate, raw_rate = [], [], [], [], [], []
    for _ in range(args.runs):
        t_ours: list[float] = []
        t_raw: list[float] = []
        for i, text in zip(batch, texts, strict=True):
            t0 = time.perf_counter()
            engine.evaluate(FLOW_QUERY, i)
            t1 = time.perf_counter()
            raw.set_input_json(text)
            raw.eval_rule(FLOW_QUERY)
            t2 = time.perf_counter()
            t_ours.append(t1 - t0)
            t_raw.append(t2 - t1)
        p50, p99 = percentiles(t_ours)
        r50, r99 = percentiles(t_raw)
        ours_p50.append(p50)
        ours_p99.append(p99)
        raw_p50.append(r50)
        raw_p99.append(r99)
        ours_rate.append(len(t_ours) / sum(t_ours))
        raw_rate.append(len(t_raw) / sum(t_raw))
    med = statistics.median
    line("decision p50 (PolicyEngine vs raw regorus)", med(ours_p50) * 1e6, "us", med(raw_p50) * 1e6)
    line("decision p99 (PolicyEngine vs raw regorus)", med(ours_p99) * 1e6, "us", med(raw_p99) * 1e6)
    line("decisions/s (PolicyEngine vs raw regorus)", med(ours_rate), "1/s", med(raw_rate))

    progress.step("the whole allowed flow set")
    full_ours = [timed(lambda: engine.evaluate(ALLOWED_FLOWS_QUERY, {})) for _ in range(args.runs)]
    raw.set_input_json("{}")
    full_raw = [timed(lambda: raw.eval_rule_as_json(ALLOWED_FLOWS_QUERY)) for _ in range(args.runs)]
    n_entries = len(engine.evaluate(ALLOWED_FLOWS_QUERY, {}))
    line(f"allowed_flows full set, {n_entries} entries (PolicyEngine vs raw regorus)", med(full_ours), "s",
         med(full_raw))
    line("allowed_flows full set vs goal", med(full_ours), "s", 0.25)

    # one grant change, the way the grants service sees it: a freshly built document (distinct objects),
    # then sync_data (diff -> patch) and the next decision. Added grant: merged into the engine; revoked
    # grant: full reload from the per-shard JSON cache. Baseline: set_data of the whole document.
    probe = {"src": {"tenant": "t0001", "group": "g1"}, "dst": {"tenant": "t0002", "group": "g2"},
             "proto": "tcp", "port": 9999}
    grant = {"src_group": "g1", "dst_group": "g2", "proto": "tcp", "ports": [9999], "expires_at_ns": FAR_NS}
    text = json.dumps(doc)
    added: list[float] = []
    removed: list[float] = []
    full: list[float] = []
    diffs: list[float] = []

    def reload(apply: Callable[[RegorusEngine, dict[str, Any]], None], new: dict[str, Any]) -> None:
        apply(engine, new)
        engine.evaluate(FLOW_QUERY, probe)

    for k in range(max(5, args.runs)):
        with_grant = json.loads(text)
        with_grant["tf"]["grants"].setdefault("t0001", {}).setdefault("t0002", {})[f"new{k}"] = grant
        without = json.loads(text)
        added.append(timed(partial(reload, sync_data, with_grant)))
        assert engine.evaluate(FLOW_QUERY, probe)["allow"] is True
        diffs.append(timed(partial(diff_documents, engine.data(), without)))
        removed.append(timed(partial(reload, sync_data, without)))
        assert engine.evaluate(FLOW_QUERY, probe)["allow"] is False
        fresh = json.loads(text)
        full.append(timed(partial(reload, RegorusEngine.set_data, fresh)))
    line("data reload after one grant added (incremental vs full)", med(added) * 1e3, "ms", med(full) * 1e3)
    line("data reload after one grant revoked (incremental vs full)", med(removed) * 1e3, "ms", med(full) * 1e3)
    line("data reload after one grant added vs goal", med(added) * 1e3, "ms", 50.0)
    line("data reload after one grant revoked vs goal", med(removed) * 1e3, "ms", 50.0)
    line("of which diffing two 1,000-tenant documents", med(diffs) * 1e3, "ms", med(removed) * 1e3)

    # the grants service knows which grant changed: grant_ops patches it without rebuilding or diffing
    from datetime import UTC, datetime, timedelta

    from policy.data import grant_ops
    from policy.models import Grant

    now = datetime.now(UTC)
    row = Grant(id="bench-grant", src_tenant="t0001", src_group="g1", dst_tenant="t0002", dst_group="g2",
                proto="tcp", ports=[9999], ttl_seconds=3600, state="active", requested_by="bench",
                requester_tenant="", created_at=now, expires_at=now + timedelta(hours=1))
    op_add: list[float] = []
    op_remove: list[float] = []
    for _ in range(max(5, args.runs)):
        row.state = "active"
        op_add.append(timed(lambda: reload(lambda e, _d: e.patch_data(grant_ops(e.data(), row, now)), {})))
        row.state = "revoked"
        op_remove.append(timed(lambda: reload(lambda e, _d: e.patch_data(grant_ops(e.data(), row, now)), {})))
    line("one grant activated via grant_ops (vs full reload)", med(op_add) * 1e3, "ms", med(full) * 1e3)
    line("one grant revoked via grant_ops (vs full reload)", med(op_remove) * 1e3, "ms", med(full) * 1e3)
    line("one grant revoked via grant_ops vs goal", med(op_remove) * 1e3, "ms", 50.0)

    # the same through trustfabric pdp over HTTP, answered by the OPA engine
    pdp_engine = RegorusEngine(modules, doc)
    url, server, thread = serve(pdp_engine)
    try:
        opa = OpaServerEngine(OpaSettings(url=url, timeout=30.0))
        opa._modules = modules
        opa._data = doc
        opa.evaluate(FLOW_QUERY, batch[0])
        h50: list[float] = []
        h99: list[float] = []
        hrate: list[float] = []
        for _ in range(args.runs):
            t_http: list[float] = []
            for i in batch[:500]:
                start = time.perf_counter()
                opa.evaluate(FLOW_QUERY, i)
                t_http.append(time.perf_counter() - start)
            a, b = percentiles(t_http)
            h50.append(a)
            h99.append(b)
            hrate.append(len(t_http) / sum(t_http))
        line("decision p50 over HTTP (pdp vs embedded)", med(h50) * 1e6, "us", med(ours_p50) * 1e6)
        line("decision p99 over HTTP (pdp vs embedded)", med(h99) * 1e6, "us", med(ours_p99) * 1e6)
        line("decisions/s over HTTP (pdp vs embedded)", med(hrate), "1/s", med(ours_rate))
        bulk = [timed(lambda: opa.evaluate_many(FLOW_QUERY, batch[:500])) for _ in range(args.runs)]
        line("500 decisions in one bulk HTTP query (pdp vs embedded one by one)", med(bulk), "s",
             500 / med(ours_rate))
        full_http = [timed(lambda: opa.evaluate(ALLOWED_FLOWS_QUERY, {})) for _ in range(args.runs)]
        line("allowed_flows full set over HTTP (pdp vs embedded)", med(full_http), "s", med(full_ours))
        opa.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    progress.step("hot decisions through the compiled VM")
    vm_figures(args, modules, doc, batch)
    progress.step("the consistency check")
    consistency_figures(args, modules, doc)


if __name__ == "__main__":
    main()
