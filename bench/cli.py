"""`trustfabric --help` start-up time: the installed binary, median of RUNS runs, beside a bare interpreter
start (`python -c pass`) measured in the same run. Goal: < 0.3 s (it loads neither FastAPI nor a database;
tests/cli/test_smoke.py checks that part)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = str(Path(sys.executable).parent / "trustfabric")
RUNS = int(os.environ.get("BENCH_RUNS", "9"))


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - start


def main() -> int:
    bare, helped = [], []
    for _ in range(RUNS):  # interleaved, so load changes hit both alike
        bare.append(timed([sys.executable, "-c", "pass"]))
        helped.append(timed([BIN, "--help"]))
    h, b = statistics.median(helped), statistics.median(bare)
    print(f"# scale: {RUNS} runs each, interleaved; load average {os.getloadavg()[0]:.2f}")
    print(f"cli_help_startup: {h:.3f} s (baseline python -c pass {b:.3f} s, ratio {h / b:.2f})")
    print(f"cli_help_startup vs goal: {h:.3f} s (baseline 0.300 s, ratio {h / 0.3:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
