"""Servers the tests start and always stop: the installed `trustfabric serve` binary as a process, or an app
served by uvicorn on a thread of this process. Both on 127.0.0.1, each on a port of its own."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn


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
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
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
