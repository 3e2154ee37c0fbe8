"""Where a request spends the event loop's CPU: the real app (api.app.create_app over a seeded SQLite data
directory, the shipped policy active) driven in-process through its ASGI interface, one request at a time, beside
a bare ASGI app and two minimal FastAPI apps (a `def` route, run in FastAPI's worker thread, and an `async def`
one) driven the same way (issue 11). The routes (BENCH_ROUTES, comma-separated; both by default): `grants`, POST
/v1/grants, each request a distinct grant (its own Idempotency-Key and justification); `svid`, POST
/v1/svids/x509, an SVID renewal of a registered workload (the same CSR each time, as an agent reusing its key).

The figure is the CPU time of the thread running the event loop per request (time.thread_time: the worker
threads' CPU, the route's own work and the group commit, is not in it), medians of RUNS runs of REQUESTS. uvicorn's
HTTP protocol is not in these figures (bench/http_protocol.py measures it: ~35 us per request).

Then RUNS runs with a timer around each layer (each middleware of the built stack, the route's body read, the
dependencies, the authentication, the endpoint's hand-off to its thread and back, the response's send): the loop
CPU of each layer, its inner layers' excluded. The timers' own cost is in those figures (about 1 us each), so
their sum exceeds the untimed total a little. Timing a function means replacing it for that run: done here, in a
benchmark, never in the product.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi import Request, Response  # module level: the routes' annotations are resolved from here

import api.app
from api.schemas import GrantCreate

REQUESTS = int(os.environ.get("BENCH_REQUESTS", "400"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
ROUTES = [r.strip() for r in os.environ.get("BENCH_ROUTES", "grants,svid").split(",") if r.strip()]
GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
         "ttl_seconds": 3600, "justification": "bench"}
TOKEN = "eyJ" + "x" * 420  # the size of an API token, for the apps that do not check it

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Route:
    """One route's requests: its method and path, and each request's body and extra headers."""

    def __init__(self, name: str, path: str, body: Callable[[str], bytes], keyed: bool) -> None:
        self.name, self.path, self.body, self.keyed = name, path, body, keyed

    def request(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        key = uuid.uuid4().hex
        return self.body(key), [(b"idempotency-key", key.encode())] if self.keyed else []


def routes() -> dict[str, Route]:
    from bench.pki import _csr

    renewal = json.dumps({"csr": _csr().decode(), "tenant": "acme", "group": "web", "workload": "web-1",
                          "ttl_seconds": 3600}).encode()
    return {
        "grants": Route("POST /v1/grants", "/v1/grants",
                        lambda key: json.dumps({**GRANT, "justification": f"bench {key}"}).encode(), keyed=True),
        "svid": Route("POST /v1/svids/x509", "/v1/svids/x509", lambda _key: renewal, keyed=False),
    }


def _scope(token: str, path: str, body: bytes, extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """What uvicorn's httptools protocol hands the app for a POST of a JSON body."""
    headers = [(b"host", b"127.0.0.1:8443"), (b"accept-encoding", b"identity"), (b"accept", b"*/*"),
               (b"connection", b"keep-alive"), (b"authorization", f"Bearer {token}".encode()),
               (b"content-type", b"application/json"), *extra,
               (b"content-length", str(len(body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "server": ("127.0.0.1", 8443), "client": ("127.0.0.1", 50000), "scheme": "http", "method": "POST",
            "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers, "state": {}}


async def _one(app: App, token: str, route: Route) -> int:
    body, extra = route.request()
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:
            await asyncio.Event().wait()  # as a server does: nothing more until the client goes away
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(token, route.path, body, extra), receive, send)
    return int(sent[0]["status"])


async def _loop_cpu(app: App, token: str, route: Route, n: int, process: list[float] | None = None) -> float:
    """Event-loop thread CPU (us) per request over `n` requests one after another (and the whole process's,
    its worker threads' included, appended to `process`)."""
    gc.collect()
    start, start_process = time.thread_time(), time.process_time()
    for _ in range(n):
        status = await _one(app, token, route)
        if status >= 300:
            raise RuntimeError(f"request answered {status}")
    if process is not None:
        process.append((time.process_time() - start_process) * 1e6 / n)
    return (time.thread_time() - start) * 1e6 / n


def bare_app() -> App:
    reply = json.dumps({"id": "g" * 32, "state": "pending", "padding": "p" * 600}).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(reply))]})
        await send({"type": "http.response.body", "body": reply})

    return app


def fastapi_app(sync: bool) -> App:
    """A FastAPI app with one POST /v1/grants taking a GrantCreate body, answering a fixed JSON Response: the
    framework's own cost for a `def` route (run in its worker thread) or an `async def` one."""
    from fastapi import FastAPI

    reply = json.dumps({"id": "g" * 32, "state": "pending", "padding": "p" * 600}).encode()
    app = FastAPI()
    if sync:
        @app.post("/v1/grants", status_code=201)
        def grant_sync(body: GrantCreate, request: Request) -> Response:
            return Response(reply, status_code=201, media_type="application/json")
    else:
        @app.post("/v1/grants", status_code=201)
        async def grant_async(body: GrantCreate, request: Request) -> Response:
            return Response(reply, status_code=201, media_type="application/json")
    return app


class Layers:
    """Loop-thread CPU per named layer, inner layers excluded (one request at a time: one stack)."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self._stack: list[list[int]] = []  # [start, children's time]
        self.order: list[str] = []
        self.loop_thread = threading.get_ident()

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        if threading.get_ident() != self.loop_thread:  # a worker thread's CPU is not the loop's
            yield
            return
        if name not in self.own:
            self.own[name] = 0.0
            self.order.append(name)
        frame = [time.thread_time_ns(), 0]
        self._stack.append(frame)
        try:
            yield
        finally:
            elapsed = time.thread_time_ns() - frame[0]
            self._stack.pop()
            self.own[name] += elapsed - frame[1]
            if self._stack:
                self._stack[-1][1] += elapsed

    def asgi(self, name: str, app: Any) -> App:
        async def timed(scope: Any, receive: Any, send: Any) -> None:
            with self.timing(name):
                await app(scope, receive, send)

        return timed

    def coroutine(self, name: str, fn: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(name):
                return await fn(*args, **kwargs)

        return timed

    def function(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(name):
                return fn(*args, **kwargs)

        return timed


def instrument(app: Any, layers: Layers) -> list[Callable[[], None]]:
    """Timers around every layer of `app`'s built middleware stack and the route's parts; the undo steps."""
    import fastapi.routing as fr
    from starlette.requests import Request
    from starlette.responses import Response

    undo: list[Callable[[], None]] = []

    def swap(owner: Any, attr: str, value: Any) -> None:
        old = getattr(owner, attr)
        setattr(owner, attr, value)
        undo.append(lambda: setattr(owner, attr, old))

    node = app.middleware_stack
    swap(app, "middleware_stack", layers.asgi(type(node).__name__, node))
    while hasattr(node, "app") and not isinstance(node, type(app.router)):
        inner = node.app
        swap(node, "app", layers.asgi(type(inner).__name__, inner))
        node = inner
    swap(fr, "solve_dependencies", layers.coroutine("dependencies (less authentication)",
                                                    fr.solve_dependencies))  # type: ignore[attr-defined]
    swap(fr, "run_endpoint_function", layers.coroutine("endpoint (its hand-off to a worker thread and back)",
                                                       fr.run_endpoint_function))
    swap(Request, "body", layers.coroutine("body read", Request.body))
    swap(Request, "json", layers.coroutine("JSON parse", Request.json))
    swap(Response, "__call__", layers.coroutine("response send", Response.__call__))
    authenticators = app.state.authenticators
    app.state.authenticators = [layers.function("authentication (token check, on the loop)", a) for a in authenticators]
    undo.append(lambda: setattr(app.state, "authenticators", authenticators))
    return undo


def seeded_app(work: Path) -> tuple[Any, str, Any]:
    from tests.api.conftest import make_settings, open_env, seed

    env = open_env(make_settings(work / "home", quota_pending=0, quota_grants=0))
    seed(env)
    return env.app, env.headers("tenant-admin", "acme")["Authorization"].split(" ", 1)[1], env


def main() -> int:
    chosen = routes()
    unknown = [r for r in ROUTES if r not in chosen]
    if unknown or not ROUTES:
        print(f"BENCH_ROUTES: unknown route(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(chosen)}",
              file=sys.stderr)
        return 2
    grant = chosen["grants"]  # the baselines' request (their routes take a GrantCreate)
    with tempfile.TemporaryDirectory(prefix="tf-bench-asgi-") as work:
        app, token, env = seeded_app(Path(work))
        try:
            apps: dict[str, tuple[App, str, Route]] = {
                "bare ASGI app": (bare_app(), TOKEN, grant),
                "FastAPI def route": (fastapi_app(sync=True), TOKEN, grant),
                "FastAPI async def route": (fastapi_app(sync=False), TOKEN, grant),
                **{f"trustfabric {chosen[r].name}": (app, token, chosen[r]) for r in ROUTES},
            }
            loop = asyncio.new_event_loop()
            try:
                for candidate, tok, route in apps.values():  # warm: engines, validators, the first inclusion
                    loop.run_until_complete(_loop_cpu(candidate, tok, route, 50))
                settle = getattr(api.app, "settle", None)
                if settle is not None:  # as a server process does when its app starts (absent before issue 11)
                    settle()
                figures: dict[str, list[float]] = {name: [] for name in apps}
                process: dict[str, list[float]] = {name: [] for name in apps}
                for _ in range(RUNS):
                    for name, (candidate, tok, route) in apps.items():
                        figures[name].append(loop.run_until_complete(
                            _loop_cpu(candidate, tok, route, REQUESTS, process[name])))
                timed: dict[str, list[Layers]] = {r: [] for r in ROUTES}
                for r in ROUTES:
                    for _ in range(RUNS):
                        layers = Layers()
                        undo = instrument(app, layers)
                        try:
                            loop.run_until_complete(_loop_cpu(app, token, chosen[r], REQUESTS))
                        finally:
                            for step in reversed(undo):
                                step()
                        timed[r].append(layers)
            finally:
                loop.close()
        finally:
            env.client.close()
            env.ctx.close()
    base = statistics.median(figures["bare ASGI app"])
    print(f"# scale: in-process ASGI calls, one at a time, SQLite, {REQUESTS} requests x {RUNS} runs (medians); "
          f"event-loop thread CPU per request; load {os.getloadavg()[0]:.1f}")
    for name, values in figures.items():
        value = statistics.median(values)
        print(f"asgi_loop_cpu_per_request[{name}]: {value:.0f} us (baseline bare ASGI app {base:.0f} us, "
              f"ratio {value / base:.2f})")
    base_whole = statistics.median(process["bare ASGI app"])
    for r in ROUTES:
        name = f"trustfabric {chosen[r].name}"
        whole = statistics.median(process[name])
        print(f"asgi_process_cpu_per_request[{name}]: {whole:.0f} us (worker threads included; "
              f"baseline bare ASGI app {base_whole:.0f} us, ratio {whole / base_whole:.2f})")
    for r in ROUTES:
        runs = timed[r]
        own = {n: statistics.median(t.own.get(n, 0.0) for t in runs) / 1000 / REQUESTS for n in runs[0].order}
        print(f"# per layer, {chosen[r].name}, medians of {RUNS} timed runs (timers included: "
              f"{sum(own.values()):.0f} us in all)")
        for n, value in own.items():
            print(f"asgi_layer_loop_cpu[{chosen[r].name}: {n}]: {value:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
