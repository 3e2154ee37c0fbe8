"""What the policy sandbox costs (issue 13, item 5): the shipped policies' Rego tests, and the activation
check on a generated inventory, run in a limited job process (policy/sandbox.py) beside the same work done
in-process, measured in the same run.

Scale: rego/ (the shipped policies and their tests); the activation check on TENANTS tenants of 4 groups.
Prints `<figure>: <value> <unit> (baseline <value> <unit>, ratio <r>)`, medians of RUNS runs, the fork
server already started (its one-off start is printed on its own); sandboxed and in-process runs alternate, and
"added" is the median of their per-pair differences. Goal: the sandbox adds under 50 ms to a job. The bench
imports the CLI as the server's entry script does, so a job pays here what it pays in the server.
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

import cli.main  # noqa: F401  # the server's entry script imports it: a job must not pay for it (policy/sandbox.py)
from policy import authoring, budget
from policy.sandbox import Limits, run_limited
from policy.shipped import REGO_DIR
from policy.versions import load_dir

RUNS = int(os.environ.get("BENCH_RUNS", "11"))
TENANTS = int(os.environ.get("BENCH_TENANTS", "200"))
LIMITS = Limits(cpu_seconds=30, memory_mb=2048, workers=1)


def _data(tenants: int) -> dict[str, Any]:
    groups = {f"g{i}": {"labels": {}, "exposed": {"tcp": [443, 8443]}, "sensitivity": "normal", "quarantined": False}
              for i in range(4)}
    return {"tf": {"tenants": {f"t{t}": {"quarantined": False, "groups": groups} for t in range(tenants)},
                   "grants": {}, "revoked": {}}}


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def _paired(inline: Callable[[], object], boxed: Callable[[], object]) -> tuple[float, float, float]:
    """(median in-process ms, median sandboxed ms, median of the per-pair differences): the two alternate,
    so a change in the machine's load hits both alike (a shared 2-core machine swings by 2x within seconds)."""
    pairs = [(_ms(inline), _ms(boxed)) for _ in range(RUNS)]
    med = statistics.median
    return med(a for a, _ in pairs), med(b for _, b in pairs), med(b - a for a, b in pairs)


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
        inline, boxed, added = _paired(
            lambda fn=fn, args=args: fn(*args),  # type: ignore[misc]
            lambda fn=fn, args=args, what=figure: run_limited(fn, *args, limits=LIMITS, what=what))  # type: ignore[misc]
        print(f"{figure}_in_sandbox: {boxed:.1f} ms (baseline {inline:.1f} ms in-process, ratio {boxed / inline:.2f}); "
              f"added {added:.1f} ms, goal < 50 ms {'met' if added < 50 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
