"""`trustfabric pdp` as a real process, and the PDP following the database (pdp/sync.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from policy.decide import decide_flow
from policy.engines.opa_server import OpaServerEngine, OpaSettings
from tests.api.conftest import make_settings
from tests.policy.conftest import LOADED, free_port
from tests.policy.helpers import REGO_DIR, ROOT, flow, shipped, small_doc
from workflows.context import AppContext


def test_trustfabric_pdp_serves_decisions(tmp_path: Path) -> None:
    """The real command in a subprocess, asked through the OPA engine over HTTP."""
    port = free_port()
    envvars = {**os.environ, "TRUSTFABRIC_PDP_TOKEN": "cli-token", "TRUSTFABRIC_HOME": str(tmp_path / "h")}
    proc = subprocess.Popen([sys.executable, "-c", "from cli.main import main; main()", "pdp", "--rego", str(REGO_DIR),
                             "--port", str(port)], cwd=ROOT, env=envvars, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        engine = OpaServerEngine(OpaSettings(url=url, token="cli-token", timeout=LOADED))
        engine._modules = shipped()  # already served by --rego
        engine.set_data(small_doc())
        assert decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080)).allow
        assert not decide_flow(engine, flow("evil", "bot", "acme", "web", "tcp", 443)).allow
        engine.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_pdp_from_database_follows_the_active_version(tmp_path: Path) -> None:
    from audit import Actor
    from pdp.sync import PdpSync
    from policy import service
    from policy.engines.embedded import RegorusEngine
    from tests.policy.dbutil import populate

    ctx = AppContext.open(make_settings(tmp_path / "home"), create=True)
    try:
        engine = RegorusEngine()
        sync = PdpSync(ctx.db, engine, interval=60)
        sync.run_once()
        assert not decide_flow(engine, flow("acme", "web", "acme", "db", "tcp", 5432)).allow
        with ctx.db.session() as s:
            populate(s, ctx.clock())
            service.upload(s, shipped(), Actor("sec", "security"), now=ctx.clock())
            service.activate(s, 1, Actor("sec", "security"), now=ctx.clock())
        sync.run_once()
        assert sync.active_hash is not None
        assert decide_flow(engine, flow("acme", "web", "acme", "db", "tcp", 5432)).allow
        assert decide_flow(engine, flow("acme", "web", "globex", "api", "tcp", 8443)).allow  # grant `live`
    finally:
        ctx.close()


def test_pdp_following_the_database_refuses_writes(tmp_path: Path) -> None:
    """A PDP that serves the active version is read-only: no local client swaps a module or adds a grant;
    and a module changed by any other means is put back on the next refresh."""
    from fastapi.testclient import TestClient

    from audit import Actor
    from pdp.server import create_pdp_app
    from pdp.sync import PdpSync
    from policy import service
    from policy.engines.embedded import RegorusEngine
    from tests.policy.dbutil import populate

    ctx = AppContext.open(make_settings(tmp_path / "home"), create=True)
    try:
        with ctx.db.session() as s:
            populate(s, ctx.clock())
            service.upload(s, shipped(), Actor("sec", "security"), now=ctx.clock())
            service.activate(s, 1, Actor("sec", "security"), now=ctx.clock())
        engine = RegorusEngine()
        sync = PdpSync(ctx.db, engine, interval=60)
        sync.run_once()
        denied = flow("acme", "web", "globex", "api", "tcp", 9443)
        assert not decide_flow(engine, denied).allow
        allow_all = 'package flows\n\ndecision := {"allow": true, "reasons": ["pwned"]}\n'
        with TestClient(create_pdp_app(engine, read_only=True)) as c:
            r = c.put("/v1/policies/flows.rego", content=allow_all, headers={"Content-Type": "text/plain"})
            # as OPA answers a write to a path its bundle owns: 400 invalid_parameter, naming the bundle
            assert r.status_code == 400 and r.json()["code"] == "invalid_parameter"
            assert r.json()["message"].startswith('all paths owned by bundle "trustfabric"')
            assert c.delete("/v1/policies/flows.rego").status_code == 400
            grant = {"src_group": "web", "dst_group": "api", "proto": "tcp", "ports": [9443],
                     "expires_at_ns": 9 * 10**18}
            assert c.put("/v1/data/tf/grants/acme/globex/evil", json=grant).status_code == 400
            assert c.patch("/v1/data/tf", json=[{"op": "add", "path": "/revoked/x", "value": True}]).status_code == 400
            assert c.put("/v1/data", json={}).status_code == 400
            assert c.delete("/v1/data/tf").status_code == 400
            assert c.post("/v1/data/flows/decision", json={"input": denied}).json()["result"]["allow"] is False
        assert not decide_flow(engine, denied).allow
        engine.load({**shipped(), "flows.rego": allow_all})  # changed behind the sync's back
        sync.run_once()
        assert engine.modules() == shipped() and not decide_flow(engine, denied).allow
    finally:
        ctx.close()
