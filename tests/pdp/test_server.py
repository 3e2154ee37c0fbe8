"""`trustfabric pdp` over real HTTP (uvicorn on 127.0.0.1): the OPA REST subset, token, TLS."""

from __future__ import annotations

import datetime as dt
import gzip
import ipaddress
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from policy.decide import decide_flow
from policy.engines.opa_server import OpaServerEngine, OpaSettings
from tests.policy.conftest import LOADED, Served, serve_pdp
from tests.policy.helpers import flow, shipped, small_doc


def test_opa_rest_subset(pdp: Served) -> None:
    h = {"Authorization": f"Bearer {pdp.token}"}
    with httpx.Client(base_url=pdp.url, headers=h, timeout=5) as c:
        assert c.get("/health").status_code == 200
        assert c.put("/v1/policies/demo/a.rego", content="package demo\n\nallow if input.x == data.cfg.x\n",
                     headers={"Content-Type": "text/plain"}).status_code == 200
        assert c.get("/v1/policies/demo/a.rego").json()["result"]["id"] == "demo/a.rego"
        assert "demo/a.rego" in [p["id"] for p in c.get("/v1/policies").json()["result"]]
        bad = c.put("/v1/policies/demo/b.rego", content="package demo\n\nbroken if {\n",
                    headers={"Content-Type": "text/plain"})
        assert bad.status_code == 400
        err = bad.json()
        assert err["code"] == "invalid_parameter" and err["errors"][0]["location"]["file"] == "demo/b.rego"
        assert c.get("/v1/policies/demo/b.rego").status_code == 404  # nothing stored
        assert c.put("/v1/data/cfg", json={"x": 1}).status_code == 204
        assert c.post("/v1/data/demo/allow", json={"input": {"x": 1}}).json() == {"result": True}
        assert c.post("/v1/data/demo/allow", json={"input": {"x": 2}}).json() == {}  # undefined
        assert c.patch("/v1/data/cfg", json=[{"op": "replace", "path": "/x", "value": 2}]).status_code == 204
        assert c.get("/v1/data/cfg").json() == {"result": {"x": 2}}
        assert c.post("/v1/data/demo/allow", json={"input": {"x": 2}}).json() == {"result": True}
        q = c.post("/v1/query", json={"query": "r0 := data.demo.allow with input as {\"x\": 2}; r1 := data.cfg.x"})
        assert q.json() == {"result": [{"r0": True, "r1": 2}]}
        assert c.patch("/v1/data/cfg", json=[{"op": "remove", "path": "/nope"}]).status_code == 400
        assert c.delete("/v1/data/cfg").status_code == 204
        assert c.delete("/v1/data/cfg").status_code == 404
        assert c.delete("/v1/policies/demo/a.rego").status_code == 200
        assert c.delete("/v1/policies/demo/a.rego").status_code == 404
        assert c.post("/v1/query", content=b"not json").status_code == 400
    assert httpx.get(pdp.url + "/v1/policies", timeout=5).status_code == 401
    assert httpx.get(pdp.url + "/v1/policies", headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401


def _self_signed(tmp: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "pdp.crt", tmp / "pdp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_opa_engine_over_tls_with_bearer_token(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served = serve_pdp(token="tls-token", ssl_certfile=cert, ssl_keyfile=key)
    try:
        engine = OpaServerEngine(OpaSettings(url=served.url, token="tls-token", ca_bundle=cert, timeout=LOADED))
        engine.load(shipped(), small_doc())
        assert decide_flow(engine, flow("acme", "web", "acme", "batch", "tcp", 8080)).allow
        engine.close()
        # a server the client cannot verify: fail closed
        untrusted = OpaServerEngine(OpaSettings(url=served.url, token="tls-token"))
        untrusted._modules = shipped()
        d = decide_flow(untrusted, flow("acme", "web", "acme", "batch", "tcp", 8080))
        assert not d.allow and d.reasons[0].startswith("engine-error:")
        untrusted.close()
    finally:
        served.stop()


def test_bad_opa_url_is_rejected() -> None:
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput):
        OpaServerEngine(OpaSettings(url="ftp://x"))


def test_oversized_bodies_are_refused_before_parsing() -> None:
    from fastapi.testclient import TestClient

    from pdp.server import create_pdp_app

    with TestClient(create_pdp_app(max_body_bytes=1024)) as c:
        big = b'{"x": "' + b"a" * 2000 + b'"}'
        r = c.put("/v1/data/cfg", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert c.get("/v1/data/cfg").json() == {}  # nothing stored
        assert c.put("/v1/data/cfg", json={"x": 1}).status_code == 204
        assert c.post("/v1/data/cfg/x", json={"input": {}}).json() == {"result": 1}
        # a gzip body is held to the same limit once inflated: a small bomb is refused, not inflated
        bomb = gzip.compress(b'{"input": "' + b"a" * 100_000 + b'"}')
        assert len(bomb) < 1024
        r = c.post("/v1/data/cfg/x", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413 and r.json()["code"] == "invalid_parameter"


def _alias_bomb(levels: int, width: int = 9, *, pairs: bool = False) -> bytes:
    """A YAML document of a few hundred bytes whose aliases expand to width**levels strings ("billion laughs");
    `pairs`: each level a !!pairs list (tuples, in Python)."""
    item = "k: *a{}" if pairs else "*a{}"
    lines = ["a0: &a0 [" + ",".join(['"xxxxxxxx"'] * width) + "]"]
    lines += [f"a{i}: &a{i} {'!!pairs ' if pairs else ''}[" + ",".join([item.format(i - 1)] * width) + "]"
              for i in range(1, levels)]
    return ("\n".join(lines) + f"\ninput: *a{levels - 1}\n").encode()


def test_a_yaml_alias_bomb_is_refused_at_once(pdp: Served) -> None:
    """A YAML body's aliases were expanded without a bound: 395 bytes became 4.8 million values (4.5 s of the
    PDP's CPU walking them, 58 MB of JSON for the engine), each level nine times more (9 levels: minutes and gigabytes,
    the node's PDP gone). Any local client may ask the PDP; now such a body is 400 before anything walks it."""
    h = {"Authorization": f"Bearer {pdp.token}", "Content-Type": "application/yaml"}
    with httpx.Client(base_url=pdp.url, headers=h, timeout=2) as c:
        for body in (_alias_bomb(7), _alias_bomb(30), _alias_bomb(30, pairs=True)):
            for r in (c.post("/v1/data/x/allow", content=body), c.post("/", content=body.replace(b"input: ", b"i: ")),
                      c.put("/v1/data/cfg", content=body)):
                assert r.status_code == 400, (r.status_code, r.text[:200])
                assert r.json()["code"] == "invalid_parameter" and "aliases" in r.json()["message"], r.text
        # an alias or two, as a person writes them, is still YAML the PDP reads
        r = c.post("/v1/data/x/allow", content=b"base: &b {x: 1}\ninput: {a: *b, b: *b}\n")
        assert r.status_code == 200, r.text


def test_a_small_yaml_input_with_anchors_is_read(pdp: Served) -> None:
    """A 3 KB YAML input whose one anchored list (200 addresses) is named by 40 keys is 8,000 values: harmless, and
    what anchors are for, but more than two per byte of its text, so the bound refused it as a bomb."""
    addresses = ", ".join(f"10.0.{i // 250}.{i % 250}" for i in range(200))
    refs = "".join(f"  h{i}: *all\n" for i in range(1, 40))
    body = f"input:\n  h0: &all [{addresses}]\n{refs}".encode()
    assert len(body) < 4096
    h = {"Authorization": f"Bearer {pdp.token}", "Content-Type": "application/yaml"}
    with httpx.Client(base_url=pdp.url, headers=h, timeout=5) as c:
        r = c.post("/v1/data/x/allow", content=body)
    assert r.status_code == 200, r.text
