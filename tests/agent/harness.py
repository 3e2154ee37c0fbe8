"""A real server for agent tests: the golden fabric imported, the shipped policy active, the reconciler
running (woken by every write), served over TLS with client certificates on a free 127.0.0.1 port by
uvicorn; and agents started in this process against it. The reconciler runs for the whole fixture while the
HTTP listener can be stopped and started again on the same port (the fail-static tests)."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from agent.device_loop import LoopSettings
from agent.runner import Agent, AgentConfig
from api.auth.mtls import PeerCertH11Protocol
from api.tls import ServerTls, prepare_server_tls
from audit import Actor
from pki.service import create_join_token
from tests.api.conftest import TD, Env
from tests.api.test_devices import fabric_env
from tests.enforcer.helpers import SMALL
from tests.policy.conftest import free_port

FAST = LoopSettings(wait=20, drift_every=0.5, report_every=2.0, backoff_min=0.1, backoff_max=1.0)


@dataclass
class Served:
    env: Env
    tls: ServerTls
    port: int
    home: Path
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    agents: dict[str, Agent] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = uvicorn.Config(
            self.env.app, host="127.0.0.1", port=self.port, log_level="warning", http=PeerCertH11Protocol,
            ssl_certfile=str(self.tls.certfile), ssl_keyfile=str(self.tls.keyfile),
            ssl_keyfile_password=self.tls.password, ssl_ca_certs=str(self.tls.ca_file),
            ssl_cert_reqs=ssl.CERT_OPTIONAL, lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="test-api-server")
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop listening; held long-polls are not waited for (a loaded machine once kept one open for minutes)."""
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=3)
            if self.thread.is_alive():
                self.server.force_exit = True
                self.thread.join(timeout=15)
            if self.thread.is_alive():
                raise RuntimeError("the test server did not stop")
            self.server = None

    def join_token(self, node: str) -> str:
        with self.env.ctx.db.session() as s:
            return create_join_token(s, node_name=node, actor=Actor.system("test"), clock=self.env.clock)

    def agent(self, node: str, *, lab: Path | None = None, socket: Path | None = None,
              loop: LoopSettings = FAST, start: bool = True, **kw: Any) -> Agent:
        data = self.home / "agents" / node
        token = None if (data / "node.pem").exists() else self.join_token(node)
        a = Agent(AgentConfig(node=node, server=self.url, ca_file=self.tls.ca_file, data_dir=data, join_token=token,
                              socket=socket, lab_home=lab, loop=loop, placements_every=0.5, **kw))
        self.agents[node] = a
        return a.start() if start else a


@contextmanager
def served_fabric(home: Path, fabric_file: Path = SMALL, td: str = TD) -> Iterator[Served]:
    """A fabric file (the golden one by default) on a running TLS server; every agent started through it is
    stopped at the end. Also the propagation benchmark's server (bench/propagation.py)."""
    env = fabric_env(home, running=True, fabric_file=fabric_file, td=td)  # the reconciler runs with the server
    tls = prepare_server_tls(env.ctx, hosts=("localhost",), ips=("127.0.0.1",))
    served = Served(env, tls, free_port(), home)
    runtime = env.app.state.enforcer
    try:
        runtime.start()
        served.start()
        yield served
    finally:
        for a in served.agents.values():
            a.stop()
        served.stop()
        runtime.stop()
        env.client.close()
        tls.cleanup()
        env.ctx.close()


def workload_stub(channel: Any) -> Any:
    """spiffe's generated Workload API client stub on `channel` (a grpc.Channel)."""
    from spiffe._proto import workload_pb2_grpc

    # the generated gRPC module has no annotations (as in agent/workload_api.py, which mounts its servicer)
    return workload_pb2_grpc.SpiffeWorkloadAPIStub(channel)  # type: ignore[no-untyped-call]


def gpu1_fabric(home: Path, workloads: list[str]) -> Path:
    """SMALL's fabric with `workloads` (tenant/group/name) more, registered and placed on gpu1 (a host port and an
    address each, in order): a fabric file in `home`, for served_fabric."""
    fabric = yaml.safe_load(SMALL.read_text())
    fabric["nodes"]["gpu1"]["nic"]["host_ports"] += [f"pf1vf{i}" for i in range(len(workloads))]
    for i, w in enumerate(workloads):
        fabric["workloads"][w] = None
        fabric["placements"][w] = {"node": "gpu1", "port": f"pf1vf{i}", "ipv4": f"10.1.1.{10 + i}"}
    path = home / "fabric.yaml"
    path.write_text(yaml.safe_dump(fabric))
    return path
