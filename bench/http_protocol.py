"""The HTTP/1.1 protocol's own CPU per request: `trustfabric serve`'s protocol (api/server.py's BoundedProtocol,
over uvicorn's httptools parser) beside uvicorn's h11 protocol, which serve ran before (issue 11: the event loop
every request of a replica goes through).

Each serves a bare ASGI app (reads the body, answers a fixed JSON body of the size of a grant) in a uvicorn
process of its own, one worker, with the limits serve configures; a closed loop of CONNECTIONS keep-alive
connections POSTs a grant request body with a bearer token (bench/api.py's load generator). The figure is the
server process's CPU time (user + system) per request, which hardly depends on what else the cores run; medians
of RUNS runs of DURATION seconds, the two protocols alternating.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.api import CONNECTIONS, DURATION, RUNS, free_port, measure, wait_healthy

APP = textwrap.dedent('''
    import json, sys
    import uvicorn
    from api.auth.mtls import PeerCertH11Protocol
    from api.server import ConnectionLimits, uvicorn_config

    BODY = json.dumps({"id": "g" * 32, "state": "pending", "reasons": ["approval-needed: tenant-admin:globex"],
                       "required_approvers": ["tenant-admin:globex"], "padding": "p" * 400}).encode()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]})
        await send({"type": "http.response.body", "body": BODY})

    config = uvicorn_config(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning",
                            limits=ConnectionLimits(), lifespan="off", access_log=False)
    if sys.argv[2] == "h11":
        config.http = PeerCertH11Protocol  # what serve ran before issue 11's change (its bounds aside)
    uvicorn.Server(config).run()
''')
GRANT = {"src_group": "web", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [443],
         "ttl_seconds": 3600, "justification": "bench"}
TOKEN = "eyJ" + "x" * 420  # the size of an API token


def cpu_per_request(script: Path, protocol: str) -> float:
    """Server CPU (us) per request over one closed-loop run against a fresh server using `protocol`."""
    import psutil

    port = free_port()
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen([sys.executable, str(script), str(port), protocol], cwd=root,
                            env={**os.environ, "PYTHONPATH": root}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, "/", proc)
        measure(port, "POST", "/v1/grants", TOKEN, GRANT)  # warm-up
        server = psutil.Process(proc.pid)
        before = server.cpu_times()
        out = measure(port, "POST", "/v1/grants", TOKEN, GRANT)
        after = server.cpu_times()
        used = (after.user - before.user) + (after.system - before.system)
        return float(used * 1e6 / max(1.0, out["rps"] * DURATION))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tf-bench-http-") as work:
        script = Path(work) / "bare_server.py"
        script.write_text(APP)
        ours: list[float] = []
        h11: list[float] = []
        for _ in range(RUNS):
            ours.append(cpu_per_request(script, "serve"))
            h11.append(cpu_per_request(script, "h11"))
    value, base = statistics.median(ours), statistics.median(h11)
    print(f"# scale: bare ASGI app, 1 uvicorn worker, loopback, {CONNECTIONS} keep-alive connections POSTing a grant "
          f"body, median of {RUNS} runs x {DURATION:g} s, protocols alternating; load {os.getloadavg()[0]:.1f}")
    print(f"http_protocol_server_cpu_per_request: {value:.0f} us "
          f"(baseline h11 {base:.0f} us, ratio {value / base:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
