"""The device API: ETag and 304, long-polls woken by a publication (of this process at once, of another
process through the shared poll) and timing out cleanly, held long-polls holding no worker thread, status
reports stored and audited on change, the device list, and device scoping over real mTLS (a node's SVID
reads and reports only its own devices; a leaf's agent joins under the leaf's name)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select

from api.app import create_app
from api.tls import prepare_server_tls
from audit import Actor
from audit.models import AuditEvent
from enforcer.ir import DeviceRuleSet
from policy.models import DecisionRecord
from tests.api.conftest import TD, Client, Env, activate_shipped_policy, make_settings, open_env
from tests.api.test_mtls import TlsServer, client_ctx, key_pem, new_csr
from tests.enforcer.helpers import SMALL
from tests.policy.conftest import free_port
from workflows.enforcement import make_reconciler
from workflows.fabric import Who, import_fabric

pytestmark = pytest.mark.xdist_group("devices")
TRAIN_TO_API = {"nic:gpu1", "nic:gpu3", "leaf:leaf1", "leaf:leaf2"}


def fabric_env(home: Path, *, running: bool, database_url: str | None = None, fabric_file: Path = SMALL,
               td: str = TD) -> Env:
    """The golden fabric (or `fabric_file`) imported, the shipped policy active, every device published once;
    with `running` the app runs the reconciler (woken after every write) for the TestClient's lifetime."""
    env = open_env(make_settings(home, database_url, enforcer_poll_seconds=0.2, trust_domain=td), td=td)
    with env.ctx.db.session() as s:
        import_fabric(s, Who(Actor.system("t"), env.clock), env.ctx.settings.pools(), fabric_file.read_text())
    activate_shipped_policy(env)
    rec = make_reconciler(env.ctx)
    assert rec.run_once("start").published
    env.client.close()
    env.app = create_app(env.ctx, enforcer=rec if running else None)
    env.client = Client(env.app, raise_server_exceptions=False)
    return env


@pytest.fixture
def denv(tmp_path: Path) -> Iterator[Env]:
    env = fabric_env(tmp_path / "home", running=True)
    with env.client:  # runs the lifespan: the reconciler's thread
        yield env
    env.client.close()
    env.ctx.close()


def approve_grant_over_the_api(env: Env) -> str:
    r = env.call("POST", "/v1/grants", "tenant-admin", "acme", json={
        "src_group": "train", "dst_tenant": "globex", "dst_group": "api", "proto": "tcp", "ports": [8443],
        "ttl_seconds": 3600})
    assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    gid = str(r.json()["id"])
    r = env.call("POST", f"/v1/grants/{gid}/approve", "tenant-admin", "globex", json={})
    assert r.status_code == 200 and r.json()["state"] == "active", r.text
    return gid


def test_etag_304_and_a_long_poll_that_times_out_cleanly(denv: Env) -> None:
    r = denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "admin")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["device"], body["version"]) == ("nic:gpu1", 1) and r.headers["etag"] == f'"{body["content_hash"]}"'
    assert DeviceRuleSet.from_dict(body["ir"]).content_hash == body["content_hash"]  # what the agent applies
    etag = r.headers["etag"]
    again = denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "admin", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.headers["etag"] == etag and again.content == b""
    start = time.monotonic()
    held = denv.call("GET", "/v1/devices/nic:gpu1/ruleset?wait=1", "security", headers={"If-None-Match": etag})
    assert held.status_code == 304 and 0.9 <= time.monotonic() - start < 5
    other = denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "admin", headers={"If-None-Match": '"0000"'})
    assert other.status_code == 200
    assert denv.call("GET", "/v1/devices/nic:gpu9/ruleset", "admin").status_code == 404
    assert denv.call("GET", "/v1/devices/router:x/ruleset", "admin").status_code == 422
    assert denv.call("GET", "/v1/devices/nic:gpu1/ruleset?wait=61", "admin").status_code == 422
    assert denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "tenant-admin", "acme").status_code == 403


def test_a_grant_approval_answers_the_held_long_polls_of_exactly_the_touched_devices(denv: Env) -> None:
    etags = {d: denv.call("GET", f"/v1/devices/{d}/ruleset", "admin").headers["etag"]
             for d in ("nic:gpu1", "nic:gpu2")}
    answers: dict[str, tuple[int, float]] = {}

    def poll(device: str) -> None:
        start = time.monotonic()
        r = denv.call("GET", f"/v1/devices/{device}/ruleset?wait=4", "admin", headers={"If-None-Match": etags[device]})
        answers[device] = (r.status_code, time.monotonic() - start)

    threads = [threading.Thread(target=poll, args=(d,)) for d in etags]
    for t in threads:
        t.start()
    time.sleep(0.3)
    start = time.monotonic()
    approve_grant_over_the_api(denv)  # the API wakes the reconciler after the commit
    for t in threads:
        t.join(timeout=15)
    assert answers["nic:gpu1"][0] == 200 and answers["nic:gpu1"][1] < 3.5, answers  # woken by the publication
    assert answers["nic:gpu2"][0] == 304, answers  # not touched by the grant: it waited out its time
    assert time.monotonic() - start < 8
    rows = {r["device"]: r for r in denv.call("GET", "/v1/devices", "security").json()}
    assert {d for d, r in rows.items() if r["desired_version"] == 2} == TRAIN_TO_API
    history = denv.call("GET", "/v1/devices/nic:gpu1/versions", "auditor").json()
    assert [v["version"] for v in history["items"]] == [2, 1] and history["next_before"] is None
    assert history["items"][0]["cause"] != history["items"][1]["cause"]
    first = denv.call("GET", "/v1/devices/nic:gpu1/versions?limit=1", "security").json()
    assert [v["version"] for v in first["items"]] == [2] and first["next_before"] == 2
    older = denv.call("GET", "/v1/devices/nic:gpu1/versions?limit=1&before=2", "security").json()
    assert [v["version"] for v in older["items"]] == [1] and older["next_before"] is None
    assert older["items"][0]["content_hash"] == etags["nic:gpu1"].strip('"')
    r = denv.call("GET", "/v1/devices/nic:nowhere/versions", "security")
    assert r.status_code == 404 and "nic:nowhere" in r.json()["reason"]


def test_a_publication_by_another_process_wakes_a_long_poll_through_the_shared_poll(tmp_path: Path) -> None:
    env = fabric_env(tmp_path / "home", running=False)  # this app runs no reconciler
    try:
        etag = env.call("GET", "/v1/devices/nic:gpu3/ruleset", "admin").headers["etag"]
        answer: list[Any] = []

        def poll() -> None:
            answer.append(env.call("GET", "/v1/devices/nic:gpu3/ruleset?wait=10", "admin",
                                   headers={"If-None-Match": etag}))

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.3)
        approve_grant_over_the_api(env)
        elsewhere = make_reconciler(env.ctx)  # "another process": nothing tells this app's watch
        assert "nic:gpu3" in elsewhere.run_once("elsewhere").published
        t.join(timeout=15)
        assert answer and answer[0].status_code == 200 and answer[0].json()["version"] == 2
    finally:
        env.client.close()
        env.ctx.close()


def test_status_reports_are_stored_and_audited_only_when_the_state_changes(denv: Env) -> None:
    r1 = denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "admin").json()
    report = {"applied_version": 1, "applied_hash": r1["content_hash"],
              "counters": {"0x1a2b": {"packets": 10, "bytes": 900}}}

    def events() -> list[AuditEvent]:
        with denv.ctx.db.read_session() as s:
            return list(s.exec(select(AuditEvent).where(AuditEvent.action == "device.status")).all())

    r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=report, headers={"X-Request-ID": "rep-1"})
    assert r.status_code == 200 and r.json()["in_sync"] is True, r.text
    assert [(e.object_id, e.request_id, e.summary["in_sync"]) for e in events()] == [("nic:gpu1", "rep-1", True)]
    more = {**report, "counters": {"0x1a2b": {"packets": 99, "bytes": 9000}}}
    assert denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=more).status_code == 200
    assert len(events()) == 1  # counters alone: stored, not audited
    drift = {**more, "drift": ["table=1 cookie=0x1a2b missing"], "drift_repaired": True}
    assert denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=drift).status_code == 200
    assert len(events()) == 2 and events()[-1].summary["drift"] == 1
    row = next(x for x in denv.call("GET", "/v1/devices", "admin").json() if x["device"] == "nic:gpu1")
    assert denv.call("GET", "/v1/devices/nic:gpu1", "auditor").json() == row  # one device: the list's row
    assert denv.call("GET", "/v1/devices/nic:gpu9", "admin").status_code == 404
    assert row["counters"] == {"0x1a2b": {"packets": 99, "bytes": 9000}} and row["drift_repaired"] is True
    assert row["applied_version"] == row["desired_version"] == 1 and row["applied_at"] is not None
    bad = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json={**report, "applied_hash": "0" * 64})
    assert bad.status_code == 400 and "does not match version 1" in bad.json()["reason"]
    assert denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json={"colour": "red"}).status_code == 422
    assert len(events()) == 2


def test_a_status_report_numbered_below_the_stored_one_is_answered_stale_and_changes_nothing(denv: Env) -> None:
    """A report that reached the server after a newer one (its request timed out on the agent and was retried, or an
    old agent process sent it) is answered 200 with the stored row and `stale: true`; it changes nothing and records
    no event. A report number or applied version that is not a JSON integer is 422."""
    r1 = denv.call("GET", "/v1/devices/nic:gpu1/ruleset", "admin").json()
    applied = {"applied_version": 1, "applied_hash": r1["content_hash"]}

    def events() -> int:
        with denv.ctx.db.read_session() as s:
            return len(s.exec(select(AuditEvent).where(AuditEvent.action == "device.status")).all())

    repaired = {**applied, "drift": ["table=0 cookie=0x1 missing"], "drift_repaired": True, "report_seq": 7}
    newer = {**applied, "counters": {"0x1": {"packets": 5, "bytes": 300}}, "report_seq": 8}
    for report in (repaired, newer):
        r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=report)
        assert r.status_code == 200 and r.json()["stale"] is False and r.json()["report_seq"] == report["report_seq"]
    stored, n = denv.call("GET", "/v1/devices/nic:gpu1", "admin").json(), events()
    assert "stale" not in stored and stored["drift_repaired"] is False
    late = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=repaired)
    assert late.status_code == 200, late.text
    assert late.json() == {**stored, "stale": True}
    assert denv.call("GET", "/v1/devices/nic:gpu1", "admin").json() == stored and events() == n
    for bad in (0, -3, 2**63, "x", True, "9", 9.0):  # strict: no bool, string or float read as a number
        r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json={**newer, "report_seq": bad})
        assert r.status_code == 422 and "report_seq" in r.text, (bad, r.text)
    for not_bool in ("yes", 1, "true", 0):  # strict: only a JSON boolean says whether drift was repaired
        r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json={**repaired, "report_seq": 9,
                                                                          "drift_repaired": not_bool})
        assert r.status_code == 422 and "drift_repaired" in r.text, (not_bool, r.text)
    for not_int in (True, "1", 1.0):  # strict: the applied version is a JSON integer, like the report number
        r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json={**newer, "report_seq": 9,
                                                                          "applied_version": not_int})
        assert r.status_code == 422 and "applied_version" in r.text, (not_int, r.text)
    assert denv.call("GET", "/v1/devices/nic:gpu1", "admin").json() == stored and events() == n
    unnumbered = {k: v for k, v in repaired.items() if k != "report_seq"}  # an agent from before numbering
    r = denv.call("POST", "/v1/devices/nic:gpu1/status", "admin", json=unnumbered)
    assert r.status_code == 200 and r.json()["stale"] is False and r.json()["drift_repaired"] is True
    assert r.json()["report_seq"] == 8 and events() == n + 1


def test_held_long_polls_hold_no_worker_thread(tmp_path: Path) -> None:
    """More long-polls than the server's thread pool (40) are held while a plain request still gets through."""
    import uvicorn

    env = fabric_env(tmp_path / "home", running=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(env.app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        headers = env.headers("admin")
        etag = httpx.get(f"{base}/v1/devices/nic:gpu1/ruleset", headers=headers).headers["etag"]

        async def main() -> tuple[list[int], float]:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30,
                                         limits=httpx.Limits(max_connections=200)) as c:
                held = [asyncio.create_task(c.get("/v1/devices/nic:gpu1/ruleset?wait=3",
                                                  headers={"If-None-Match": etag})) for _ in range(60)]
                await asyncio.sleep(0.8)
                start = time.monotonic()
                listed = await c.get("/v1/devices")  # a sync route: it needs a worker thread
                took = time.monotonic() - start
                assert listed.status_code == 200
                return [r.status_code for r in await asyncio.gather(*held)], took

        codes, took = asyncio.run(main())
        assert codes == [304] * 60 and took < 2.0, took
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        env.client.close()
        env.ctx.close()


def node_identity(env: Env, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A node SVID through a join token, as `trustfabric node token create` and the agent's attestation do."""
    from pki.service import attest_node, create_join_token

    key, csr = new_csr()
    with env.ctx.db.session() as s:
        join = create_join_token(s, node_name=name, actor=Actor.system("t"), clock=env.clock)
    with env.ctx.db.session() as s:
        issued = attest_node(s, env.ctx.keystore, token=join, csr_pem=csr, clock=env.clock)
    cert, kfile = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert.write_bytes(issued.full_chain_pem)
    kfile.write_bytes(key_pem(key))
    return cert, kfile


def test_a_node_svid_reads_and_reports_only_its_own_devices(tmp_path: Path) -> None:
    env = fabric_env(tmp_path / "home", running=False)
    tls = prepare_server_tls(env.ctx)
    server = TlsServer(env, tls)
    try:
        with env.ctx.db.session() as s:  # acme/train/w1 on gpu1 runs as uid 1001
            from workflows.fabric import place_workload

            place_workload(s, Who(Actor.system("t"), env.clock), env.ctx.settings.pools(), "acme/train/w1",
                           node="gpu1", port="pf0vf0", ipv4="10.1.0.11", ipv6="fd00:1::11",
                           selectors=["unix:uid:1001"])
        url = f"https://localhost:{server.port}"

        def client(name: str) -> httpx.Client:
            cert, key = node_identity(env, tmp_path, name)
            return httpx.Client(base_url=url, verify=client_ctx(tls, cert, key), timeout=10)

        with client("gpu1") as gpu1, client("leaf1") as leaf1:
            own = gpu1.get("/v1/devices/nic:gpu1/ruleset")
            assert own.status_code == 200 and own.json()["device"] == "nic:gpu1"
            status = gpu1.post("/v1/devices/nic:gpu1/status", json={"applied_version": 1,
                                                                     "applied_hash": own.json()["content_hash"]})
            assert status.status_code == 200 and status.json()["in_sync"] is True
            assert {**gpu1.get("/v1/devices/nic:gpu1").json(), "stale": False} == status.json()  # stored: not stale
            mine = gpu1.get("/v1/nodes/gpu1/placements").json()
            assert [(p["workload"], p["spiffe_id"], p["selectors"]) for p in mine] == [
                ("acme/train/w1", "spiffe://example.org/tenant/acme/group/train/w1", ["unix:uid:1001"]),
                ("globex/batch/b1", "spiffe://example.org/tenant/globex/batch/b1".replace("batch", "group/batch"),
                 [])]
            for r in (gpu1.get("/v1/devices/nic:gpu3/ruleset"), gpu1.get("/v1/devices/nic:gpu3"),
                      gpu1.post("/v1/devices/nic:gpu3/status", json={}),
                      gpu1.get("/v1/devices/leaf:leaf1/ruleset"), gpu1.get("/v1/nodes/gpu3/placements"),
                      gpu1.get("/v1/devices"), leaf1.get("/v1/devices/leaf:leaf2/ruleset"),
                      gpu1.post("/v1/fabric/nodes", json={"name": "x", "uplinks": ["p0"]})):
                assert r.status_code == 403 and r.json()["reason"], r.text
            assert leaf1.get("/v1/devices/leaf:leaf1/ruleset").status_code == 200  # a leaf's agent: its own leaf
        with env.ctx.db.read_session() as s:
            denied = s.exec(select(DecisionRecord).where(DecisionRecord.kind == "authz")).all()
        asked = sorted(json.dumps(d.input["resource"]) for d in denied if not d.allowed)
        assert asked == sorted(json.dumps({"device": d}) for d in ("nic:gpu3", "nic:gpu3", "nic:gpu3", "leaf:leaf1",
                                                                    "node:gpu3", "leaf:leaf2"))
        assert all("out-of-scope" in d.reasons[0] for d in denied)
    finally:
        server.stop()
        tls.cleanup()
        env.client.close()
        env.ctx.close()


def test_a_device_that_left_the_fabric_is_gone_for_its_agent(denv: Env) -> None:
    assert denv.call("DELETE", "/v1/fabric/placements/platform/dns/ns1", "admin").status_code == 200
    r = denv.call("DELETE", "/v1/fabric/nodes/gpu4", "admin")
    assert r.status_code == 200 and r.json()["changes"]["nodes"]["removed"]["names"] == ["gpu4"], r.text
    deadline = time.monotonic() + 10  # the reconciler, woken by the write, retires the device
    while (got := denv.call("GET", "/v1/devices/nic:gpu4/ruleset", "admin")).status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert got.status_code == 404 and "left the fabric" in got.json()["reason"]
    row = next(x for x in denv.call("GET", "/v1/devices", "admin").json() if x["device"] == "nic:gpu4")
    assert row["in_fabric"] is False


def test_a_stopping_server_answers_its_held_long_polls_at_once(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM with agents long-polling: each held poll is answered 304 as the server starts to stop. Left
    waiting, uvicorn cancelled them after its graceful wait (5 s), each an 'Exception in ASGI application'
    with a traceback in the log, and the agents got no answer."""
    import uvicorn

    from api.server import ConnectionLimits, uvicorn_config
    from tests.api.test_server import start

    env = fabric_env(tmp_path / "home", running=False)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(env.app, host="127.0.0.1", port=port, workers=1, log_level="warning",
                                           limits=ConnectionLimits(graceful_shutdown_timeout=5), lifespan="off",
                                           log_config=None))
    thread = start(server)
    answers: list[tuple[int, str | None, float]] = []
    try:
        base, auth = f"http://127.0.0.1:{port}", env.headers("admin")
        etags = {d: httpx.get(f"{base}/v1/devices/{d}/ruleset", headers=auth).headers["etag"]
                 for d in ("nic:gpu1", "leaf:leaf1")}

        def hold(device: str) -> None:
            r = httpx.get(f"{base}/v1/devices/{device}/ruleset?wait=30", timeout=30,
                          headers={**auth, "If-None-Match": etags[device]})
            answers.append((r.status_code, r.headers.get("etag"), time.monotonic()))

        polls = [threading.Thread(target=hold, args=(d,)) for d in etags]
        for t in polls:
            t.start()
        time.sleep(0.5)  # both held
        assert answers == []
        with caplog.at_level(logging.ERROR):
            stopping = time.monotonic()
            server.should_exit = True
            for t in polls:
                t.join(timeout=15)
            thread.join(timeout=15)
            stopped = time.monotonic() - stopping
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        env.client.close()
        env.ctx.close()
    assert sorted((code, tag) for code, tag, _ in answers) == sorted((304, tag) for tag in etags.values())
    assert all(at - stopping < 2 for _, _, at in answers)
    assert not thread.is_alive() and stopped < 3, stopped  # not the 5 s graceful wait
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
