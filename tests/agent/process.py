"""The installed `trustfabric agent` binary as a node runs it: its own process (and session, so a failing test
kills only it and its children), its output in a log file shown when a wait fails, every wait bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.agent.harness import Served

BIN = str(Path(sys.executable).parent / "trustfabric")
SETTLE = 20.0  # bound on every wait (a loaded machine); typically well under a second


class AgentProcess:
    def __init__(self, served: Served, node: str, logs: Path, *extra: str) -> None:
        self.served = served
        self.node = node
        self.logs = logs
        self.extra = list(extra)
        self.data = served.home / "agents" / node
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A join token on the first run only: later runs use the stored SVID."""
        args = [BIN, "agent", "--node", self.node, "--server", self.served.url, "--ca", str(self.served.tls.ca_file),
                "--data-dir", str(self.data), *self.extra]
        if not (self.data / "node.pem").exists():
            args += ["--join-token", self.served.join_token(self.node)]
        self.runs += 1
        with (self.logs / f"{self.node}-run{self.runs}.log").open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**{k: v for k, v in os.environ.items()
                                                 if k != "TRUSTFABRIC_TEST_PAUSE"}, **(env or {})})
        return self.proc

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.logs.glob(f"{self.node}-run*.log")))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=SETTLE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only this agent and its children
            proc.wait(timeout=10)

    def wait(self, check: Callable[[], bool], what: str, timeout: float = SETTLE) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the agent exited ({self.proc.returncode}) while waiting for {what}:\n"
                                     f"{self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout} s: {what}\n{self.log_text()}")
            time.sleep(0.05)

    def in_sync(self, device: str) -> bool:
        r = self.served.env.call("GET", "/v1/devices", "admin")
        assert r.status_code == 200, r.text
        d = next(x for x in r.json() if x["device"] == device)
        return bool(d["in_sync"]) and not d["last_error"]


@contextmanager
def lab_served(root: Path) -> Iterator[tuple[Served, Path, dict[str, Any]]]:
    """The golden lab built in agent mode and the golden fabric served, for a module's agents; the lab taken
    down in a finally whatever happened (the agents started through the Served are stopped before)."""
    from lab import build, operations, state
    from tests.agent.harness import served_fabric
    from tests.enforcer.helpers import SMALL
    from tests.lab.conftest import require_lab

    require_lab()
    lab_home = root / "lab"
    try:
        operations.up(lab_home, SMALL, "agent")
        st = state.load(lab_home)
        assert st is not None
        with served_fabric(root / "server") as served:
            yield served, lab_home, st
    finally:
        build.teardown(lab_home)
