"""Issue 13 item 1 over real mTLS: a node's SVID obtains X.509- and JWT-SVIDs only for the workloads placed on
that node (as a SPIRE agent obtains only the entries parented to it); anything else -- another node's
workload, a workload placed nowhere, an unknown one -- is the same 403, writes nothing (no SVID, no audit
event) and is kept in the decision log as a denied authorization (api/routes/common.denial_logged, where a
quarantine refusal is logged too). A revoked or quarantined workload gets nothing even from its own node.
Also the node's own endpoints: renewal over mTLS (a bearer cannot renew a node), and a leaf's fabric view
(its own leaf only; a SuperNIC has none)."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlmodel import SQLModel, func, select

from api.tls import prepare_server_tls
from audit.models import AuditEvent
from pki.models import IssuedSvid
from policy.models import DecisionRecord
from tests.api.conftest import Env
from tests.api.test_devices import fabric_env, node_identity
from tests.api.test_mtls import TlsServer, client_ctx, new_csr


def _count(env: Env, model: type[SQLModel]) -> int:
    with env.ctx.db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(model)).one())


def test_a_node_obtains_identities_only_for_its_own_workloads(tmp_path: Path) -> None:
    env = fabric_env(tmp_path / "home", running=False)
    tls = prepare_server_tls(env.ctx)
    server = TlsServer(env, tls)
    try:
        url = f"https://localhost:{server.port}"

        def client(name: str) -> httpx.Client:
            cert, key = node_identity(env, tmp_path, name)
            return httpx.Client(base_url=url, verify=client_ctx(tls, cert, key), timeout=10)

        with client("gpu1") as gpu1, client("leaf1") as leaf1:
            _, csr = new_csr()
            own = gpu1.post("/v1/svids/x509", json={"csr": csr.decode(), "tenant": "acme", "group": "train",
                                                    "workload": "w1"})
            assert own.status_code == 201 and own.json()["spiffe_id"].endswith("/tenant/acme/group/train/w1")
            jwt_own = gpu1.post("/v1/svids/jwt", json={"tenant": "globex", "group": "batch", "workload": "b1",
                                                       "audience": ["x"]})
            assert jwt_own.status_code == 201, jwt_own.text
            svids, events = _count(env, IssuedSvid), _count(env, AuditEvent)
            refused = [
                gpu1.post("/v1/svids/x509", json={"csr": csr.decode(), "tenant": "globex", "group": "api",
                                                  "workload": "a1"}),  # placed on gpu3
                gpu1.post("/v1/svids/jwt", json={"tenant": "globex", "group": "api", "workload": "a1",
                                                 "audience": ["x"]}),
                gpu1.post("/v1/svids/x509", json={"csr": csr.decode(), "tenant": "acme", "group": "train",
                                                  "workload": "nobody"}),  # not registered: the same answer
                leaf1.post("/v1/svids/x509", json={"csr": csr.decode(), "tenant": "acme", "group": "train",
                                                   "workload": "w1"}),  # a leaf hosts no workload
            ]
            for r in refused:
                assert r.status_code == 403 and "out-of-scope" in r.json()["reason"], r.text
            assert (_count(env, IssuedSvid), _count(env, AuditEvent)) == (svids, events)  # nothing written
            with env.ctx.db.read_session() as s:
                denied = [d for d in s.exec(select(DecisionRecord).where(DecisionRecord.kind == "authz")).all()
                          if not d.allowed]
            seen = sorted((d.input["principal"]["id"].rsplit("/", 1)[1], d.input["action"],
                           "/".join(d.input["resource"][k] for k in ("tenant", "group", "workload")),
                           d.input["resource"]["kind"]) for d in denied)
            assert seen == [("gpu1", "svid.issue", "acme/train/nobody", "x509"),
                            ("gpu1", "svid.issue", "globex/api/a1", "jwt"),
                            ("gpu1", "svid.issue", "globex/api/a1", "x509"),
                            ("leaf1", "svid.issue", "acme/train/w1", "x509")]
            assert all("out-of-scope" in d.reasons[0] for d in denied)

            # a revoked workload gets nothing, also from its own node
            r = env.call("POST", "/v1/tenants/acme/groups/train/workloads/w1/revoke", "security",
                         json={"reason": "key leaked"})
            assert r.status_code == 200, r.text
            gone = gpu1.post("/v1/svids/x509", json={"csr": csr.decode(), "tenant": "acme", "group": "train",
                                                     "workload": "w1"})
            assert gone.status_code == 403 and "revoked" in gone.json()["reason"]

            # a quarantined tenant's workload neither (the hardening's rule holds for nodes too)
            r = env.call("POST", "/v1/tenants/globex/quarantine", "security", json={"reason": "incident"})
            assert r.status_code == 200, r.text
            held = gpu1.post("/v1/svids/jwt", json={"tenant": "globex", "group": "batch", "workload": "b1",
                                                    "audience": ["x"]})
            assert held.status_code == 403 and "quarantined" in held.json()["reason"], held.text

            # renewal: the node's own SVID over mTLS, a new key; a bearer token cannot renew a node
            renewed = gpu1.post("/v1/nodes/renew", json={"csr": csr.decode()})
            assert renewed.status_code == 201 and renewed.json()["spiffe_id"] == "spiffe://example.org/node/gpu1"
            assert env.call("POST", "/v1/nodes/renew", "admin", json={"csr": csr.decode()}).status_code == 403

            # a leaf's fabric view: its own leaf, enough to route (no selectors); nothing for a SuperNIC
            view = leaf1.get("/v1/devices/leaf:leaf1/fabric")
            assert view.status_code == 200, view.text
            assert {"trust_domain", "tenants", "links", "placements"} == set(view.json())
            assert ["acme/train/w1", "gpu1", "pf0vf0", "10.1.0.11", "fd00:1::11"] in view.json()["placements"]
            assert leaf1.get("/v1/devices/leaf:leaf2/fabric").status_code == 403
            assert gpu1.get("/v1/devices/nic:gpu1/fabric").status_code == 404
    finally:
        server.stop()
        tls.cleanup()
        env.client.close()
        env.ctx.close()


def test_every_event_a_node_causes_names_it_by_its_spiffe_id(tmp_path: Path) -> None:
    """An auditor filtering the log by a node's actor gets all the node's events: its attestation and renewals name
    it by its SPIFFE ID, as its requests over mTLS (a status report) do, never by a form of their own."""
    env = fabric_env(tmp_path / "home", running=False)
    tls = prepare_server_tls(env.ctx)
    server = TlsServer(env, tls)
    node = "spiffe://example.org/node/gpu1"
    try:
        cert, key = node_identity(env, tmp_path, "gpu1")  # attests with a join token
        with httpx.Client(base_url=f"https://localhost:{server.port}", verify=client_ctx(tls, cert, key),
                          timeout=10) as gpu1:
            _, csr = new_csr()
            assert gpu1.post("/v1/nodes/renew", json={"csr": csr.decode()}).status_code == 201
            own = gpu1.get("/v1/devices/nic:gpu1/ruleset").json()
            status = gpu1.post("/v1/devices/nic:gpu1/status", json={"applied_version": 1,
                                                                     "applied_hash": own["content_hash"]})
            assert status.status_code == 200, status.text
        r = env.call("GET", "/v1/audit/events", "auditor", params={"actor": node, "limit": 1000})
        assert r.status_code == 200, r.text
        mine = r.json()["items"]
        assert {"node.attest", "node.renew", "device.status"} <= {e["action"] for e in mine}, mine
        assert all(e["actor"] == {"id": node, "kind": "node"} for e in mine), mine
        with env.ctx.db.read_session() as s:
            by_node = s.exec(select(AuditEvent).where(AuditEvent.actor_kind == "node")).all()
        assert sorted(e.seq for e in by_node) == sorted(e["seq"] for e in mine)  # no node event names it otherwise
    finally:
        server.stop()
        tls.cleanup()
        env.client.close()
        env.ctx.close()
