"""Servers the tests start and always stop: the installed `trustfabric serve` binary as a process (or several
replicas of it on one PostgreSQL database), or an app served by uvicorn on a thread of this process. All on
127.0.0.1, each on a port of its own."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

# The tests' requests to the servers they start go through one client: httpx loads the system CA bundle into
# a new SSL context for every client (~15 ms of CPU), which `httpx.get` and friends pay on each call. It keeps
# no connection: each request opens its own, as a new client would (so a killed replica or the second worker
# of a server is met as a fresh client meets it). Thread-safe (httpcore's pool locks).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30)


@contextmanager
def serve_binary(argv: list[str], *, port: int, env: dict[str, str], cwd: Path,
                 timeout: float = 60) -> Iterator[subprocess.Popen[str]]:
    """`argv` (a `trustfabric serve ... --port port`) running until /healthz answers 200; stopped with
    SIGTERM (killed after 20 s) when the block ends, whatever happened."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if HTTP.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_app(app: Any, port: int, **config: Any) -> tuple[uvicorn.Server, threading.Thread]:
    """`app` served by uvicorn on a thread (no lifespan), started; stop it with `stop_app`."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           **config))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return server, thread


def stop_app(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=10)


@contextmanager
def serve_app(app: Any, port: int, **config: Any) -> Iterator[str]:
    """`app` served by uvicorn on a thread for the block; yields its base URL."""
    server, thread = start_app(app, port, **config)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_app(server, thread)


@dataclass
class Replica:
    """One `trustfabric serve` process of a replica set."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path  # its stderr (a file, so a chatty replica never blocks on a full pipe)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def replica_env(base: dict[str, str], *, home: Path, database_url: str, **extra: str) -> dict[str, str]:
    """The environment every replica of a set shares: one data directory (the key store) and one PostgreSQL
    database; development mode, no rate limits (a test's load comes from one address)."""
    env = {k: v for k, v in base.items() if not k.startswith(("TRUSTFABRIC_", "PROMETHEUS_", "OTEL_"))}
    env.update({"TRUSTFABRIC_HOME": str(home), "TRUSTFABRIC_DATABASE_URL": database_url,
                "TRUSTFABRIC_MODE": "development", "TRUSTFABRIC_RATE_LIMIT_PER_SECOND": "0",
                "TRUSTFABRIC_IP_RATE_LIMIT_PER_SECOND": "0", "TRUSTFABRIC_LOG_LEVEL": "warning", **extra})
    return env


@contextmanager
def serve_replicas(binary: str, count: int, *, env: dict[str, str], cwd: Path, ports: list[int],
                   timeout: float = 60) -> Iterator[list[Replica]]:
    """`count` replicas (`trustfabric serve --port P`, one process each) on one database, after one `init`;
    every one answering /healthz when the block starts, every one stopped (SIGTERM, then SIGKILL) when it
    ends, whatever happened (a replica a test killed already is only reaped)."""
    subprocess.run([binary, "init", "--trust-domain", "replicas.example"], env=env, cwd=cwd, check=True,
                   capture_output=True, timeout=timeout)
    started: list[Replica] = []
    try:
        for port in ports[:count]:
            log = cwd / f"replica-{port}.log"
            with log.open("wb") as err:
                proc = subprocess.Popen([binary, "serve", "--port", str(port)], env=env, cwd=cwd,
                                        stdout=subprocess.DEVNULL, stderr=err)
            started.append(Replica(port, proc, log))
        deadline = time.monotonic() + timeout
        for replica in started:
            while True:
                try:
                    if HTTP.get(f"{replica.url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if replica.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"replica on port {replica.port} did not start: "
                                       f"{replica.log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)
        yield started
    finally:
        for replica in started:
            if replica.proc.poll() is None:
                replica.proc.send_signal(signal.SIGTERM)
        for replica in started:
            try:
                replica.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                replica.proc.wait()
