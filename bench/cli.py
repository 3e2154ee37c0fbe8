"""Command start-up: the installed `trustfabric` binary running real commands -- over the API (against
`trustfabric serve` on loopback), offline (files only) and locally (the data directory's database) -- and
every command's `--help` (the parse and load before any work), each beside a bare interpreter start
(`python -c pass`) measured in the same run, interleaved so a load change hits both alike. Median of RUNS
runs, in wall time and in CPU time (user + system of the command's process): on a shared machine the wall
time grows with the load, the CPU time much less, so both are printed. Goal: < 0.3 s a command.
Bytecode: the commands run from cached bytecode, as an installed package does (pip compiles it), kept
in the temporary folder (PYTHONPYCACHEPREFIX) and written by one warm-up run of each; a PYTHONDONTWRITEBYTECODE
in the caller's environment is dropped for them, else every run would compile the project's sources anew
(~0.05-0.1 s a command, not what a user sees). The shell's RUST_BACKTRACE is kept: the CLI itself
neutralises its cost (cli/main.py).
Everything it makes lives in one temporary folder, removed at the end."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.api import bench_env, free_port, wait_healthy
from bench.progress import Progress

BIN = str(Path(sys.executable).parent / "trustfabric")
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
GOAL = 0.3
REPO = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    return measured(cmd, env, cwd)[0]


def measured(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def leaf_commands(env: dict[str, str], cwd: Path) -> list[list[str]]:
    """Every command path, as the CLI itself lists them."""
    code = ("import typer\nfrom cli.main import app\n"
            "def walk(c, p):\n    s = getattr(c, 'commands', None)\n"
            "    if s:\n        for n, x in sorted(s.items()):\n            yield from walk(x, p + [n])\n"
            "    else:\n        yield p\n"
            "for p in walk(typer.main.get_command(app), []):\n    print(' '.join(p))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="tf-bench-cli-"))
    env = bench_env(work, TRUSTFABRIC_CONFIG=str(work / "config.yaml"), COLUMNS="100", TRUSTFABRIC_LOG_LEVEL="warning",
                    PYTHONPYCACHEPREFIX=str(work / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    server: subprocess.Popen[bytes] | None = None
    progress = Progress("cli")
    try:
        subprocess.run([BIN, "init", "--trust-domain", "bench.example"], env=env, cwd=work, check=True,
                       capture_output=True)
        port = free_port()
        server = subprocess.Popen([BIN, "serve", "--port", str(port)], env=env, cwd=work,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(port, "/healthz", server)
        admin = subprocess.run([BIN, "token", "create", "--role", "admin", "--ttl", "1h"], env=env, cwd=work,
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        env.update({"TRUSTFABRIC_SERVER": f"http://127.0.0.1:{port}", "TRUSTFABRIC_TOKEN": admin})
        subprocess.run([BIN, "tenant", "create", "acme", "--display-name", "Acme"], env=env, cwd=work, check=True,
                       capture_output=True)
        subprocess.run([BIN, "audit", "public-key"], env=env, cwd=work, check=True,
                       stdout=(work / "audit.pub").open("wb"))
        subprocess.run([BIN, "audit", "export", "--out", str(work / "audit.jsonl")], env=env, cwd=work, check=True,
                       capture_output=True)
        real = {
            "version": ["--version"],
            "whoami (api)": ["whoami"],
            "tenant_list (api)": ["tenant", "list"],
            "policy_validate (offline)": ["policy", "validate", str(REPO / "rego")],
            "policy_test (offline)": ["policy", "test", str(REPO / "rego")],
            "audit_verify (offline)": ["audit", "verify", str(work / "audit.jsonl"), "--public-key",
                                       str(work / "audit.pub")],
            "policy_list (local)": ["policy", "list"],
            "ca_status (local)": ["ca", "status"],
        }
        for args in real.values():  # warm-up: writes the bytecode cache
            measured([BIN, *args], env, work)
        bare: list[tuple[float, float]] = []
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in real}
        for run in range(RUNS):  # interleaved, so load changes hit every command alike
            progress.step(f"real commands, run {run + 1} of {RUNS}")
            for name, args in real.items():
                bare.append(measured([sys.executable, "-c", "pass"], env, work))
                runs[name].append(measured([BIN, *args], env, work))
        times = {name: [w for w, _ in rs] for name, rs in runs.items()}
        cpus = {name: [c for _, c in rs] for name, rs in runs.items()}
        bare_cpu = statistics.median(c for _, c in bare)
        commands = leaf_commands(env, work)
        helps: list[float] = []
        for i, path in enumerate(commands):
            if i % 10 == 0:
                progress.step(f"--help of every command: {i} of {len(commands)}")
            helps.append(statistics.median(timed([BIN, *path, "--help"], env, work) for _ in range(3)))
        b = statistics.median(w for w, _ in bare)
        print(f"# scale: {RUNS} runs each, interleaved with `python -c pass`; {len(commands)} commands' --help "
              f"(median of 3 each); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"cli_{name.split()[0]}: {t:.3f} s (baseline python -c pass {b:.3f} s, ratio {t / b:.2f}) "
                  f"{name[len(name.split()[0]):].strip()}")
        for name, cs in cpus.items():
            c = statistics.median(cs)
            print(f"cli_{name.split()[0]}_cpu: {c:.3f} s (baseline python -c pass {bare_cpu:.3f} s, "
                  f"ratio {c / max(bare_cpu, 1e-3):.2f})")
        h_med, h_max = statistics.median(helps), max(helps)
        slowest = " ".join(commands[helps.index(h_max)])
        print(f"cli_help_median: {h_med:.3f} s (baseline python -c pass {b:.3f} s, ratio {h_med / b:.2f})")
        print(f"cli_help_max: {h_max:.3f} s (baseline python -c pass {b:.3f} s, ratio {h_max / b:.2f}) "
              f"[{slowest}]")
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"cli_{name.split()[0]} vs goal: {t:.3f} s (baseline {GOAL:.3f} s, ratio {t / GOAL:.2f}) "
                  f"{'met' if t < GOAL else 'NOT met'}")
        print(f"cli_help_max vs goal: {h_max:.3f} s (baseline {GOAL:.3f} s, ratio {h_max / GOAL:.2f}) "
              f"{'met' if h_max < GOAL else 'NOT met'}")
        for name, cs in cpus.items():
            c = statistics.median(cs)
            print(f"cli_{name.split()[0]}_cpu vs goal: {c:.3f} s (baseline {GOAL:.3f} s, ratio {c / GOAL:.2f}) "
                  f"{'met' if c < GOAL else 'NOT met'}")
        return 0
    finally:
        progress.done()
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
