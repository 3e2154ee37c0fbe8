"""Policy test fixtures: a `trustfabric pdp` served by uvicorn on 127.0.0.1 (a free port), real OPA when
available, and engines of every kind behind the same PolicyEngine protocol."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from pdp.server import create_pdp_app
from policy.engines import PolicyEngine
from policy.engines.embedded import RegorusEngine
from policy.engines.opa_server import OpaServerEngine, OpaSettings
from tests.servers import start_app, stop_app

LOADED = 30.0  # a server engine's per-request timeout in tests: a loaded machine answers a wide bulk query
# slower than the production default (2 s), and these tests are about answers, not latency


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    token: str | None
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        stop_app(self.server, self.thread)


def serve_pdp(token: str | None = None, **ssl: str) -> Served:
    port = free_port()
    app = create_pdp_app(RegorusEngine(), token=token)
    server, thread = start_app(app, port, **ssl)
    scheme = "https" if ssl else "http"
    return Served(f"{scheme}://127.0.0.1:{port}", token, server, thread)


@pytest.fixture(scope="session")
def pdp() -> Iterator[Served]:
    served = serve_pdp(token="s3cret-pdp-token")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def opa_url() -> Iterator[str | None]:
    """A real OPA: TRUSTFABRIC_OPA_URL, or an `opa` binary on PATH started here; None when neither."""
    url = os.environ.get("TRUSTFABRIC_OPA_URL")
    if url:
        yield url
        return
    binary = shutil.which("opa")
    if binary is None:
        yield None
        return
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="tf-opa-")
    proc = subprocess.Popen([binary, "run", "--server", "--addr", f"127.0.0.1:{port}"], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


ENGINE_KINDS = ["embedded", "pdp", "opa"]


@pytest.fixture(params=ENGINE_KINDS)
def make_engine(request: pytest.FixtureRequest) -> Iterator[Callable[[], PolicyEngine]]:
    """A factory of fresh engines of one kind; every engine made is closed at the end."""
    made: list[PolicyEngine] = []
    kind = request.param
    if kind == "embedded":
        def factory() -> PolicyEngine:
            e = RegorusEngine()
            made.append(e)
            return e
    else:
        if kind == "pdp":
            served: Served = request.getfixturevalue("pdp")
            url, token = served.url, served.token
        else:
            url = request.getfixturevalue("opa_url")
            token = None
            if url is None:
                pytest.skip("no real OPA: no `opa` binary on PATH and TRUSTFABRIC_OPA_URL is not set")
        def factory() -> PolicyEngine:
            # one server for the session: each load replaces every module under the prefix, data is set fresh
            e = OpaServerEngine(OpaSettings(url=url, token=token, timeout=5.0))
            made.append(e)
            return e
    yield factory
    for e in made:
        e.close()
