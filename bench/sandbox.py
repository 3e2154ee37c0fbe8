"""What the policy sandbox costs (issue 13, item 5): the shipped policies' Rego tests, and the activation
check on a generated inventory, run in a limited job process (policy/sandbox.py) beside the same work done
in-process, measured in the same run.

Scale: rego/ (the shipped policies and their tests); the activation check on TENANTS tenants of 4 groups.
Prints `<figure>: <value> <unit> (baseline <value> <unit>, ratio <r>)`, medians of RUNS runs, the fork
server already started (its one-off start is printed on its own). Goal: the sandbox adds under 50 ms to a job.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy import authoring, budget
from policy.sandbox import Limits, run_limited
from policy.shipped import REGO_DIR
from policy.versions import load_dir

RUNS = int(os.environ.get("BENCH_RUNS", "7"))
TENANTS = int(os.environ.get("BENCH_TENANTS", "200"))
LIMITS = Limits(cpu_seconds=30, memory_mb=2048, workers=1)


def _data(tenants: int) -> dict[str, Any]:
    groups = {f"g{i}": {"labels": {}, "exposed": {"tcp": [443, 8443]}, "sensitivity": "normal", "quarantined": False}
              for i in range(4)}
    return {"tf": {"tenants": {f"t{t}": {"quarantined": False, "groups": groups} for t in range(tenants)},
                   "grants": {}, "revoked": {}}}


def _median_ms(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    modules = load_dir(REGO_DIR)
    data, now_ns = _data(TENANTS), time.time_ns()
    start = time.perf_counter()
    run_limited(authoring.validate, modules, limits=LIMITS, what="warm-up")
    print(f"scale: rego/ ({len(modules)} modules); activation check on {TENANTS} tenants x 4 groups; "
          f"{RUNS} runs; fork server start {1000 * (time.perf_counter() - start):.0f} ms (once per server process)")
    for figure, fn, args in (
        ("policy_tests", authoring.test, (modules,)),
        ("activation_check", budget.measure, (modules, data, now_ns)),
    ):
        inline = _median_ms(lambda fn=fn, args=args: fn(*args))  # type: ignore[misc]
        boxed = _median_ms(lambda fn=fn, args=args, what=figure: run_limited(  # type: ignore[misc]
            fn, *args, limits=LIMITS, what=what))
        added = boxed - inline
        print(f"{figure}_in_sandbox: {boxed:.1f} ms (baseline {inline:.1f} ms in-process, ratio {boxed / inline:.2f}); "
              f"added {added:.1f} ms, goal < 50 ms {'met' if added < 50 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
