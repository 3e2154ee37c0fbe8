"""The lab fabric's speed (root; without it the benchmark says so and exits 0).

Figures, medians of RUNS runs, each beside a baseline measured in the same run:
  - `lab up` (standalone: compile, build, apply every device) of the golden fabric (4 nodes, 2 leaves,
    1 spine) and of a generated 50-node fabric (4 leaves, 2 spines; lab.generate) vs the kernel's own cost
    of the same namespaces and veths (one `ip -batch`, created and deleted) -- goal for 50 nodes: < 10 s,
    since the propagation benchmark builds it;
  - `lab down` of the 50-node lab vs deleting its namespaces alone;
  - `lab apply` after one grant is added to the 50-node file (only the changed devices) vs re-applying
    every device;
  - a probe that answers OPEN (counters read before and after, the enforcer's walk) vs a bare TCP connect
    between the same namespaces; a BLOCKED answer vs its timeout (the CLI's 0.5 s).

Run: sudo .venv/bin/python bench/lab.py   (BENCH_RUNS, default 3)
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from enforcer.fabric_file import load_fabric_file  # noqa: E402
from lab import build, netops, operations, standalone, state  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.generate import fabric_yaml  # noqa: E402
from lab.probe import connect, endpoint, listening, probe  # noqa: E402
from lab.topology import Names, plan  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SMALL = ROOT / "enforcer" / "examples" / "small.yaml"
GRANT = ("  g-bench: {src: t0/data, dst: t2/train, proto: tcp, ports: [443], "
         "expires_at: 2099-01-01T00:00:00Z}\n")


def line(figure: str, value: float, unit: str, base: float, note: str = "") -> None:
    ratio = value / base if base else float("inf")
    print(f"{figure}: {value:.4g} {unit} (baseline {note}{base:.4g} {unit}, ratio {ratio:.3g})", flush=True)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_kernel(file: Path) -> tuple[float, float]:
    """(create, delete) seconds for the plan's namespaces and veths alone, in one `ip -batch` each."""
    p = plan(load_fabric_file(file), Names("tflb" + secrets.token_hex(3)))
    create = [f"netns add {ns}" for ns in p.namespaces]
    create += [f"link add {v.if_a} netns {v.ns_a} type veth peer name {v.if_b} netns {v.ns_b}" for v in p.veths]
    try:
        up = timed(lambda: netops.ip_batch(create))
    finally:
        down = timed(lambda: netops.ip_batch(f"netns del {ns}" for ns in netops.namespaces_with_prefix(
            p.names.prefix)))
    return up, down


def main() -> int:
    try:
        build.require_root()
    except LabError as exc:
        print(f"# lab benchmark skipped: {exc}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="tf-bench-lab-"))
    home = work / "home"
    big = work / "fabric50.yaml"
    big.write_text(fabric_yaml(50))
    print(f"# scale: golden fabric (4 nodes) and 50 nodes / 101 workloads / 4 leaves / 2 spines; {RUNS} runs; "
          f"load average {os.getloadavg()[0]:.2f}")
    try:
        for name, file in (("golden", SMALL), ("50 nodes", big)):
            ups, downs, raw_up, raw_down = [], [], [], []
            for _ in range(RUNS):
                r_up, r_down = raw_kernel(file)
                raw_up.append(r_up)
                raw_down.append(r_down)
                ups.append(timed(lambda f=file: operations.up(home, f)))  # type: ignore[misc]
                downs.append(timed(lambda: build.teardown(home)))
            line(f"lab_up {name}", statistics.median(ups), "s", statistics.median(raw_up), "namespaces+veths ")
            if name == "50 nodes":
                line("lab_up 50 nodes vs goal", statistics.median(ups), "s", 10.0, "goal ")
                line("lab_down 50 nodes", statistics.median(downs), "s", statistics.median(raw_down),
                     "netns del ")
        _apply_and_probe(home, big)
    finally:
        build.teardown(home)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _apply_and_probe(home: Path, big: Path) -> None:
    operations.up(home, big)
    st = state.load(home)
    assert st is not None
    fabric, compiled, _ = standalone.compile_file(big)
    full = statistics.median(timed(lambda: standalone.apply(st, fabric, compiled, only_changed=False))
                             for _ in range(RUNS))
    one = []
    original = big.read_text()
    for i in range(RUNS):
        big.write_text(original + GRANT.replace("g-bench", f"g-bench{i}"))
        one.append(timed(lambda: operations.apply(home)))
        big.write_text(original)
        operations.apply(home)
    line("lab_apply one grant (50 nodes)", statistics.median(one), "s", full, "every device ")
    st = state.load(home)
    assert st is not None
    inst = standalone.installed(st, fabric)
    src, dst = endpoint(st, "t0/train/w0"), endpoint(st, "t1/data/d35")
    probes, bare, blocked = [], [], []
    for _ in range(max(RUNS, 5)):
        probes.append(timed(lambda: probe(st, inst, src.workload, dst.workload, 5432)))
        with listening([(dst, 4, 5432)]):
            bare.append(timed(lambda: connect(src, dst, 5432)))
        blocked.append(timed(lambda: probe(st, inst, src.workload, dst.workload, 443, timeout=0.5)))
    line("lab_probe OPEN (50 nodes, across the spine)", statistics.median(probes) * 1000, "ms",
         statistics.median(bare) * 1000, "bare TCP connect ")
    line("lab_probe BLOCKED", statistics.median(blocked), "s", 0.5, "its timeout ")


if __name__ == "__main__":
    sys.exit(main())
