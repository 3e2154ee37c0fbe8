"""PKI routes through the real app (TestClient): authentication (401), authorization and tenant scope
(403), bad input (4xx with a reason) and the happy paths, with nothing written on failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from spiffe import JwtBundle, JwtSvid, TrustDomain
from sqlmodel import func, select

from audit.models import AuditEvent
from pki.models import IssuedSvid
from tests.api.conftest import Env, make_settings, open_env, seed
from tests.pki.helpers import make_csr, openssl_csr, verify_chain

TD = "example.org"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = open_env(make_settings(tmp_path / "home"))
    seed(e)
    # mint every principal's token up front: minting writes audit events of its own
    for role, tenant in (("admin", None), ("tenant-admin", "acme"), ("tenant-admin", "globex"),
                         ("tenant-member", "acme"), ("auditor", None)):
        e.headers(role, tenant)
    yield e
    e.client.close()
    e.ctx.close()


def _counts(env: Env) -> tuple[int, int]:
    with env.ctx.db.read_session() as s:
        return (int(s.exec(select(func.count()).select_from(IssuedSvid)).one()),
                int(s.exec(select(func.count()).select_from(AuditEvent)).one()))


def _x509_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"csr": make_csr().decode(), "tenant": "acme", "group": "web", "workload": "web-1"}
    body.update(over)
    return body


def test_bundle_is_public(env: Env) -> None:
    r = env.client.get("/v1/bundle")
    assert r.status_code == 200
    doc = r.json()
    assert {k["use"] for k in doc["keys"]} == {"x509-svid", "jwt-svid"} and doc["spiffe_sequence"] == 1
    pem = env.client.get("/v1/bundle", params={"format": "pem"})
    assert pem.status_code == 200 and pem.text.startswith("-----BEGIN CERTIFICATE-----")
    assert env.client.get("/v1/bundle", params={"format": "xml"}).status_code == 422


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer tf_wrongwrongwrong"}])
def test_issuance_needs_a_valid_token(env: Env, headers: dict[str, str]) -> None:
    before = _counts(env)
    for path, body in (("/v1/svids/x509", _x509_body()),
                       ("/v1/svids/jwt", {"tenant": "acme", "group": "web", "workload": "web-1", "audience": ["a"]}),
                       ("/v1/svids/revoke", {"tenant": "acme", "reason": "x"}),
                       ("/v1/nodes/tokens", {"node_name": "gpu-01"})):
        r = env.client.post(path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["reason"]
    assert _counts(env) == before


def test_issue_x509_as_admin_and_tenant(env: Env) -> None:
    r = env.call("POST", "/v1/svids/x509", "admin", json=_x509_body(), headers={"X-Request-ID": "req-123"})
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["spiffe_id"] == f"spiffe://{TD}/tenant/acme/group/web/web-1"
    roots = env.client.get("/v1/bundle", params={"format": "pem"}).content
    verify_chain(out["certificate"].encode(), [c.encode() for c in out["chain"]], roots, env.clock())
    with env.ctx.db.read_session() as s:
        last = s.exec(select(AuditEvent).order_by(AuditEvent.seq.desc())).first()  # type: ignore[attr-defined]
    assert last is not None and last.action == "svid.issue" and last.request_id == "req-123"
    assert env.call("POST", "/v1/svids/x509", "tenant-admin", "acme", json=_x509_body()).status_code == 201


@pytest.mark.parametrize(
    ("role", "tenant", "body", "status", "fragment"),
    [
        ("tenant-admin", "acme", {"tenant": "globex", "group": "api", "workload": "api-1"}, 403, "out-of-scope"),
        ("tenant-member", "acme", {}, 403, "not-permitted"),
        ("auditor", None, {}, 403, "not-permitted"),
        ("admin", None, {"csr": "garbage"}, 400, "CSR"),
        ("admin", None, {"workload": "ghost"}, 404, "not registered"),
        ("admin", None, {"ttl_seconds": 90000}, 400, "above the maximum"),
        ("admin", None, {"ttl_seconds": 0}, 422, "ttl_seconds"),
        ("admin", None, {"tenant": "Not A Slug"}, 422, "tenant"),
        ("admin", None, {"spiffe_id": "spiffe://example.org/x"}, 422, "spiffe_id"),
    ],
)
def test_issue_x509_refusals(env: Env, role: str, tenant: str | None, body: dict[str, Any], status: int,
                             fragment: str) -> None:
    before = _counts(env)
    r = env.call("POST", "/v1/svids/x509", role, tenant, json=_x509_body(**body))
    assert r.status_code == status, r.text
    assert fragment in r.json()["reason"], r.json()
    assert _counts(env) == before


def test_issue_x509_refuses_a_sha1_csr_naming_the_algorithm(env: Env) -> None:
    before = _counts(env)
    r = env.call("POST", "/v1/svids/x509", "admin", json=_x509_body(csr=openssl_csr("rsa", "sha1").decode()))
    assert r.status_code == 400, r.text
    assert "sha1WithRSAEncryption (SHA-1) is not accepted" in r.json()["reason"], r.json()
    assert _counts(env) == before


def test_jwt_svid_route(env: Env) -> None:
    r = env.call("POST", "/v1/svids/jwt", "tenant-admin", "acme",
                 json={"tenant": "acme", "group": "web", "workload": "web-1", "audience": ["svc"]})
    assert r.status_code == 201, r.text
    keys = [k for k in env.client.get("/v1/bundle").json()["keys"] if k["use"] == "jwt-svid"]
    bundle = JwtBundle.parse(TrustDomain(TD), json.dumps({"keys": keys}).encode())
    assert str(JwtSvid.parse_and_validate(r.json()["token"], bundle, {"svc"}).spiffe_id).endswith("/web-1")
    bad = env.call("POST", "/v1/svids/jwt", "admin", json={"tenant": "acme", "group": "web", "workload": "web-1",
                                                            "audience": []})
    assert bad.status_code == 422 and "audience" in bad.json()["reason"]


@pytest.mark.parametrize(("audience", "fragment"), [
    (["a\nb"], "audience[0] contains the control character U+000A"),
    (["svc", "x\u0085y"], "audience[1] contains the control character U+0085"),
    (["svc", "other", "svc"], "audience[2] repeats 'svc' (audience[0])"),
])
def test_jwt_svid_audience_refusals(env: Env, audience: list[str], fragment: str) -> None:
    """Control characters in an audience, and an audience named twice, were accepted and signed."""
    before = _counts(env)
    r = env.call("POST", "/v1/svids/jwt", "admin", json={"tenant": "acme", "group": "web", "workload": "web-1",
                                                          "audience": audience})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["reason"], r.json()
    assert _counts(env) == before
    same_case = env.call("POST", "/v1/svids/jwt", "admin", json={"tenant": "acme", "group": "web",
                                                                 "workload": "web-1", "audience": ["svc", "SVC"]})
    assert same_case.status_code == 201 and same_case.json()["audience"] == ["svc", "SVC"]  # case-sensitive


def test_revoke_and_crl(env: Env) -> None:
    serial = env.call("POST", "/v1/svids/x509", "admin", json=_x509_body()).json()["serial"]
    before = _counts(env)
    r = env.call("POST", "/v1/svids/revoke", "tenant-admin", "globex", json={"serial": serial, "reason": "x"})
    assert r.status_code == 404  # another tenant's serial is not even visible
    r = env.call("POST", "/v1/svids/revoke", "admin", json={"serial": serial, "tenant": "acme", "reason": "x"})
    assert r.status_code == 422 and "either serial" in r.json()["reason"]
    assert _counts(env) == before
    r = env.call("POST", "/v1/svids/revoke", "tenant-admin", "acme", json={"serial": serial, "reason": "leaked"})
    assert r.status_code == 200 and r.json() == {"revoked": [serial]}
    assert env.call("POST", "/v1/svids/revoke", "admin", json={"serial": serial, "reason": "x"}).status_code == 409
    crl = x509.load_der_x509_crl(env.client.get("/v1/crl").content)
    assert crl.get_revoked_certificate_by_serial_number(int(serial, 16)) is not None
    assert env.client.get("/v1/crl", params={"format": "pem"}).text.startswith("-----BEGIN X509 CRL-----")
    listing = env.call("GET", "/v1/revocations", "admin")
    assert listing.status_code == 200 and listing.json()["serials"] == [serial]
    assert env.call("GET", "/v1/revocations", "tenant-member", "acme").status_code == 403
    r = env.call("POST", "/v1/svids/revoke", "admin", json={"tenant": "acme", "group": "web", "reason": "incident"})
    assert r.status_code == 200
    assert env.call("POST", "/v1/svids/x509", "admin", json=_x509_body()).status_code == 403  # identity revoked


def test_node_join_and_attest(env: Env) -> None:
    assert env.call("POST", "/v1/nodes/tokens", "tenant-admin", "acme", json={"node_name": "gpu-01"}).status_code == 403
    r = env.call("POST", "/v1/nodes/tokens", "admin", json={"node_name": "gpu-01", "ttl_seconds": 600})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert r.json()["spiffe_id"] == f"spiffe://{TD}/node/gpu-01"
    ok = env.client.post("/v1/nodes/attest", json={"token": token, "csr": make_csr().decode()})
    assert ok.status_code == 201, ok.text
    assert ok.json()["spiffe_id"].endswith("/node/gpu-01")
    before = _counts(env)
    again = env.client.post("/v1/nodes/attest", json={"token": token, "csr": make_csr().decode()})
    assert again.status_code == 401 and "already used" in again.json()["reason"]
    unknown = env.client.post("/v1/nodes/attest", json={"token": "tfjt_nope", "csr": make_csr().decode()})
    assert unknown.status_code == 401 and "unknown" in unknown.json()["reason"]
    assert _counts(env) == before
    # the node the caller says it is must be the token's: refused unspent, then used by the right node
    token = env.call("POST", "/v1/nodes/tokens", "admin", json={"node_name": "gpu-02"}).json()["token"]
    before = _counts(env)
    wrong = env.client.post("/v1/nodes/attest", json={"token": token, "csr": make_csr().decode(),
                                                      "node_name": "gpu-03"})
    assert wrong.status_code == 401 and "is for node gpu-02, not gpu-03" in wrong.json()["reason"]
    assert _counts(env) == before
    right = env.client.post("/v1/nodes/attest", json={"token": token, "csr": make_csr().decode(),
                                                      "node_name": "gpu-02"})
    assert right.status_code == 201 and right.json()["spiffe_id"].endswith("/node/gpu-02")


def test_ca_rotate_and_status(env: Env) -> None:
    assert env.call("POST", "/v1/ca/rotate", "tenant-admin", "acme", json={"force": True}).status_code == 403
    r = env.call("POST", "/v1/ca/rotate", "admin", json={"force": True})
    assert r.status_code == 200 and r.json()["activated"] == 2
    st = env.call("GET", "/v1/ca/status", "admin").json()
    assert st["active_generation"] == 2
    # g1 signed nothing, so it retires at once and leaves the bundle
    assert [c["state"] for c in st["cas"]] == ["retired", "retired", "active", "active"]
    assert r.json()["retired"] == [1]
    assert env.client.get("/v1/bundle").json()["spiffe_sequence"] == 3


def test_crl_is_signed_once_per_change_and_served_with_an_etag(env: Env) -> None:
    """Issue 13, item 7: every GET /v1/crl signed a fresh CRL (ECDSA signatures differ each time, so two
    answers were never the same bytes) and there was no ETag, on the code before the fix."""
    first, second = env.client.get("/v1/crl"), env.client.get("/v1/crl")
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and first.headers["etag"] == second.headers["etag"]
    publisher = env.app.state.crl
    assert publisher.signings == 1
    etag = first.headers["etag"]
    r = env.client.get("/v1/crl", headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert env.client.get("/v1/crl", headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    pem = env.client.get("/v1/crl", params={"format": "pem"})
    assert pem.headers["etag"] != etag and publisher.signings == 1  # one signing serves both formats
    # a revocation is a change: the next GET signs a CRL that lists it
    serial = env.call("POST", "/v1/svids/x509", "admin", json=_x509_body()).json()["serial"]
    assert env.call("POST", "/v1/svids/revoke", "admin", json={"serial": serial, "reason": "x"}).status_code == 200
    r = env.client.get("/v1/crl", headers={"If-None-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] != etag and publisher.signings == 2
    assert x509.load_der_x509_crl(r.content).get_revoked_certificate_by_serial_number(int(serial, 16)) is not None
    # with no change, the CRL is signed again once half its validity has passed (nextUpdate never lapses)
    env.clock.advance(publisher.refresh)
    again = env.client.get("/v1/crl")
    assert again.content != r.content and publisher.signings == 3
