"""The node agent's identity and its SPIFFE Workload API, against a real server over TLS on 127.0.0.1, with
py-spiffe as the workload: the join token is used once (the key stays on the node, 0600), the node SVID
renews over mTLS without a restart; X.509- and JWT-SVIDs reach exactly the callers whose uid the placement's
selectors name (a caller running as another uid gets nothing), streams deliver the rotated SVID, and the
JWT-SVID validates through the agent."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from spiffe import JwtSource, WorkloadApiClient, X509Source

from agent.identity import AgentError
from agent.runner import Agent
from tests.agent.harness import Served, served_fabric, workload_stub

pytestmark = pytest.mark.xdist_group("agent-wlapi")
W1 = "spiffe://example.org/tenant/acme/group/train/w1"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_fabric(tmp_path_factory.mktemp("agent-wlapi")) as s:
        # w1 runs on gpu1 as this test's uid; b1 (also on gpu1) has no selector: nobody gets its identity
        r = s.env.call("PUT", "/v1/fabric/placements/acme/train/w1", "admin", json={
            "node": "gpu1", "port": "pf0vf0", "ipv4": "10.1.0.11", "ipv6": "fd00:1::11",
            "selectors": [f"unix:uid:{os.getuid()}"]})
        assert r.status_code == 200, r.text
        yield s


@pytest.fixture(scope="module")
def gpu1(served: Served) -> Iterator[Agent]:
    public = Path(tempfile.mkdtemp(prefix=f"tfa{os.getpid()}-"))  # reachable by other uids (the test's tmp is not)
    public.chmod(0o755)
    try:
        yield served.agent("gpu1", socket=public / "api.sock")
    finally:
        served.agents.pop("gpu1").stop()
        shutil.rmtree(public, ignore_errors=True)


def _client(agent: Agent) -> WorkloadApiClient:
    assert agent.workload_api is not None
    return WorkloadApiClient(socket_path=f"unix:{agent.workload_api.socket_path}", default_timeout=10)


def test_the_join_token_is_used_once_and_the_key_stays_private(served: Served, gpu1: Agent) -> None:
    node_file = gpu1.config.data_dir / "node.pem"
    assert stat.S_IMODE(node_file.stat().st_mode) == 0o600
    assert gpu1.identity.svid is not None and gpu1.identity.svid.spiffe_id == "spiffe://example.org/node/gpu1"
    # the token is spent: a second agent with it is refused, and says so in one line
    first = served.agent("gpu2", start=False)
    first.ensure_identity()
    copy = served.home / "agents" / "gpu2-copy"
    again = Agent(replace(first.config, data_dir=copy))
    with pytest.raises(AgentError, match="already used"):
        again.start()
    # and that start leaves nothing behind: it made the data directory and the key file, and takes both back (an
    # empty directory and a key beside no node key were left, for the next start to take for a node's own)
    assert not copy.exists() and not copy.with_name("gpu2-copy.key").exists() and copy.parent.is_dir()
    # another node's token (gpu3's, given to the agent of gpu4) is refused before it is spent, in one line that
    # names the token's node; nothing is written (it used to spend the token, then blame the data directory)
    gpu3_token = served.join_token("gpu3")
    wrong = Agent(replace(first.config, node="gpu4", join_token=gpu3_token,
                          data_dir=served.home / "agents" / "gpu4-wrong-token"))
    with pytest.raises(AgentError, match="join token is for node gpu3, not gpu4"):
        wrong.ensure_identity()
    assert not (served.home / "agents" / "gpu4-wrong-token" / "node.pem").exists()
    right = Agent(replace(first.config, node="gpu3", join_token=gpu3_token,
                          data_dir=served.home / "agents" / "gpu3-right-token"))
    right.ensure_identity()
    assert right.identity.svid is not None and right.identity.svid.spiffe_id.endswith("/node/gpu3")
    # a restart needs no token: the stored SVID is used
    restarted = Agent(replace(gpu1.config, join_token=None, socket=None))
    restarted.ensure_identity()
    assert restarted.identity.svid == gpu1.identity.svid


def test_the_node_svid_renews_over_mtls_without_a_restart(served: Served, gpu1: Agent) -> None:
    before = gpu1.identity.svid
    assert before is not None
    gpu1.api.renew()
    after = gpu1.identity.svid
    assert after is not None and after.pem != before.pem and after.spiffe_id == before.spiffe_id
    assert gpu1.api.placements()  # the new SVID authenticates at once
    events = served.env.call("GET", "/v1/audit/events?action=node.renew", "admin").json()
    assert any(e["action"] == "node.renew" for e in events.get("items", events) if isinstance(e, dict))


def test_py_spiffe_fetches_x509_and_jwt_svids_and_validates(gpu1: Agent) -> None:
    with _client(gpu1) as client:
        svid = client.fetch_x509_svid()
        assert str(svid.spiffe_id) == W1
        assert len(client.fetch_x509_svids()) == 1  # b1 on the same node has no selector: not ours
        bundles = client.fetch_x509_bundles()
        assert bundles.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain) is not None
        jwt_svid = client.fetch_jwt_svid(audience={"globex-api"})
        assert str(jwt_svid.spiffe_id) == W1
        checked = client.validate_jwt_svid(jwt_svid.token, "globex-api")
        assert str(checked.spiffe_id) == W1
        with pytest.raises(Exception, match=r"(?i)invalid"):
            client.validate_jwt_svid(jwt_svid.token, "another-audience")
        assert client.fetch_jwt_bundles().get_bundle_for_trust_domain(svid.spiffe_id.trust_domain) is not None


def test_spiffe_endpoint_socket_is_a_unix_uri_py_spiffe_finds(gpu1: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workload Endpoint spec 4: SPIFFE_ENDPOINT_SOCKET is `unix:///absolute/path` (no authority); a client given no
    socket falls back to the variable. The agent prints this form at start (it printed the bare path)."""
    assert gpu1.workload_api is not None
    endpoint = gpu1.workload_api.endpoint
    assert endpoint == f"unix://{gpu1.workload_api.socket_path.absolute()}" and endpoint.startswith("unix:///")
    monkeypatch.setenv("SPIFFE_ENDPOINT_SOCKET", endpoint)
    with WorkloadApiClient(default_timeout=10) as client:
        assert str(client.fetch_x509_svid().spiffe_id) == W1


def test_sources_receive_the_rotated_svid(gpu1: Agent) -> None:
    assert gpu1.workload_api is not None
    with X509Source(socket_path=f"unix:{gpu1.workload_api.socket_path}", timeout_in_seconds=10) as source, \
            JwtSource(socket_path=f"unix:{gpu1.workload_api.socket_path}", timeout_in_seconds=10) as jwts:
        first = source.get_x509_context().default_svid.leaf.serial_number
        assert str(source.get_x509_context().default_svid.spiffe_id) == W1
        assert str(jwts.fetch_svid(audience={"a"}).spiffe_id) == W1
        gpu1.svids.rotate_all()  # what a renewal at half life or a CA rotation does
        deadline = time.monotonic() + 10
        while source.get_x509_context().default_svid.leaf.serial_number == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert source.get_x509_context().default_svid.leaf.serial_number != first
        assert str(source.get_x509_context().default_svid.spiffe_id) == W1


def test_a_caller_without_the_header_or_with_another_uid_gets_nothing(gpu1: Agent) -> None:
    import grpc
    from spiffe._proto import workload_pb2

    assert gpu1.workload_api is not None
    sock = gpu1.workload_api.socket_path
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        stub = workload_stub(ch)
        with pytest.raises(grpc.RpcError) as exc:
            next(iter(stub.FetchX509SVID(workload_pb2.X509SVIDRequest(), timeout=5)))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    if os.getuid() != 0:
        pytest.skip("running a caller as another uid needs root (os.setuid in a forked child)")
    # a fresh interpreter as nobody (gRPC does not survive a fork): the same client code, another uid. The venv's
    # interpreter may live where nobody cannot read (root's home): the system's of the same version, our packages
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        pytest.skip(f"{system} is needed to run a caller as nobody (the venv's interpreter may be unreadable to it)")
    code = (f"from spiffe import WorkloadApiClient\n"
            f"try:\n"
            f"    WorkloadApiClient(socket_path='unix:{sock}', default_timeout=5).fetch_x509_svid()\n"
            f"    print('GOT-AN-SVID')\n"
            f"except Exception as e:\n"
            f"    print('denied' if 'no identity issued' in str(e) else repr(e))\n")
    out = subprocess.run([str(system), "-S", "-c", code], user=65534, group=65534, extra_groups=[], capture_output=True,
                         text=True, timeout=60, cwd="/", env={"PYTHONPATH": sysconfig.get_paths()["purelib"]})
    assert out.stdout.strip() == "denied", (out.stdout, out.stderr[-500:])


def test_a_direct_connection_to_the_grpc_port_is_not_attested(gpu1: Agent) -> None:
    import grpc
    from spiffe._proto import workload_pb2

    assert gpu1.workload_api is not None
    port = gpu1.workload_api.relay.target_port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = workload_stub(ch)
        with pytest.raises(grpc.RpcError) as exc:
            next(iter(stub.FetchX509SVID(workload_pb2.X509SVIDRequest(), timeout=5,
                                         metadata=[("workload.spiffe.io", "true")])))
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_ca_rotation_reaches_the_workload_through_its_stream(served: Served, gpu1: Agent) -> None:
    """After a forced rotation the bundle changes; the agent renews every workload SVID under the new issuing
    CA and the open stream delivers it, with the new bundle; the agent still reaches the server."""
    assert gpu1.workload_api is not None
    sock = f"unix:{gpu1.workload_api.socket_path}"
    with X509Source(socket_path=sock, timeout_in_seconds=10) as source:
        first = source.get_x509_context().default_svid
        r = served.env.call("POST", "/v1/ca/rotate", "admin", json={"force": True})
        assert r.status_code == 200, r.text
        gpu1.maintain()  # what the maintenance thread does every 30 s
        deadline = time.monotonic() + 10
        while source.get_x509_context().default_svid.leaf.issuer == first.leaf.issuer and time.monotonic() < deadline:
            time.sleep(0.05)
        svid = source.get_x509_context().default_svid
        assert svid.leaf.issuer != first.leaf.issuer and str(svid.spiffe_id) == W1
        bundle = source.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain)
        assert bundle is not None and len(bundle.x509_authorities) >= 2  # old and new roots during the overlap
    assert gpu1.api.placements()


def _stub(agent: Agent) -> Any:
    import grpc

    assert agent.workload_api is not None
    channel = grpc.insecure_channel(f"unix:{agent.workload_api.socket_path}")
    return channel, workload_stub(channel)


HEADER = [("workload.spiffe.io", "true")]


def test_every_rpc_refuses_a_request_without_the_exact_security_header(gpu1: Agent) -> None:
    """Workload Endpoint spec 3 and 6: `workload.spiffe.io: true` (case sensitive) on every request, else
    InvalidArgument, on all five RPCs, before anything else is looked at."""
    import grpc
    from spiffe._proto import workload_pb2 as pb

    channel, stub = _stub(gpu1)
    calls: dict[str, Callable[[list[tuple[str, str]] | None], object]] = {
        "FetchX509SVID": lambda md: next(iter(stub.FetchX509SVID(pb.X509SVIDRequest(), timeout=5, metadata=md))),
        "FetchX509Bundles": lambda md: next(iter(stub.FetchX509Bundles(pb.X509BundlesRequest(), timeout=5,
                                                                      metadata=md))),
        "FetchJWTBundles": lambda md: next(iter(stub.FetchJWTBundles(pb.JWTBundlesRequest(), timeout=5, metadata=md))),
        "FetchJWTSVID": lambda md: stub.FetchJWTSVID(pb.JWTSVIDRequest(audience=["a"]), timeout=5, metadata=md),
        "ValidateJWTSVID": lambda md: stub.ValidateJWTSVID(pb.ValidateJWTSVIDRequest(audience="a", svid="x.y.z"),
                                                           timeout=5, metadata=md),
    }
    with channel:
        for name, call in calls.items():
            for metadata in (None, [("workload.spiffe.io", "True")], [("workload.spiffe.io", "1")]):
                with pytest.raises(grpc.RpcError) as exc:
                    call(metadata)
                assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, metadata)


def test_fetch_jwt_svid_tells_a_malformed_spiffe_id_from_one_the_caller_may_not_have(gpu1: Agent) -> None:
    """A malformed `spiffe_id` is a malformed request: InvalidArgument (Workload Endpoint spec 6), as a missing
    audience is; it was PermissionDenied, which tells a client to back off and retry the same bad request. A
    well-formed ID the caller is not entitled to stays PermissionDenied (Workload API spec 6.2.1)."""
    import grpc
    from spiffe._proto import workload_pb2 as pb

    channel, stub = _stub(gpu1)
    with channel:
        def fetch(spiffe_id: str) -> Any:
            return stub.FetchJWTSVID(pb.JWTSVIDRequest(audience=["svc"], spiffe_id=spiffe_id), timeout=10,
                                     metadata=HEADER)

        assert [s.spiffe_id for s in fetch(W1).svids] == [W1]
        for malformed in ("not-a-spiffe-id", "SPIFFE://example.org/tenant/acme/group/train/w1", W1 + "/../w2",
                          W1 + "?x=1", "spiffe://"):
            with pytest.raises(grpc.RpcError) as exc:
                fetch(malformed)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, malformed
            assert "spiffe_id is malformed" in (exc.value.details() or ""), malformed
        for not_ours in (W1.replace("/w1", "/b1"), W1.replace("example.org", "other.org")):
            with pytest.raises(grpc.RpcError) as exc:
                fetch(not_ours)
            assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED, not_ours


def test_bundle_maps_are_keyed_by_the_trust_domain_spiffe_id(gpu1: Agent) -> None:
    """workloadapi.proto and Workload API spec 6.3: FetchX509Bundles' and FetchJWTBundles' maps are keyed by the
    SPIFFE ID of the trust domain (`spiffe://example.org`, as SPIRE sends); the bare name `example.org` was sent,
    which py-spiffe happens to accept but a strict client looking up `spiffe://example.org` does not find."""
    from spiffe import JwtBundle, TrustDomain, X509Bundle
    from spiffe._proto import workload_pb2 as pb

    channel, stub = _stub(gpu1)
    with channel:
        x509_bundles = next(iter(stub.FetchX509Bundles(pb.X509BundlesRequest(), timeout=10, metadata=HEADER)))
        jwt_bundles = next(iter(stub.FetchJWTBundles(pb.JWTBundlesRequest(), timeout=10, metadata=HEADER)))
    assert list(x509_bundles.bundles) == ["spiffe://example.org"]
    assert list(jwt_bundles.bundles) == ["spiffe://example.org"]
    roots = X509Bundle.parse_raw(TrustDomain("example.org"), x509_bundles.bundles["spiffe://example.org"])
    assert roots.x509_authorities and all(r.subject == r.issuer for r in roots.x509_authorities)
    jwks = JwtBundle.parse(TrustDomain("example.org"), jwt_bundles.bundles["spiffe://example.org"])
    assert jwks.jwt_authorities  # JWT-SVID keys only (each with its kid), which py-spiffe's parser demands


def test_validate_jwt_svid_refuses_what_the_jwt_svid_spec_forbids(gpu1: Agent) -> None:
    """JWT-SVID spec 2.1 (`alg` only RS/ES/PS 256-512: EdDSA was accepted), 2.3 (`typ`, when set, JWT or JOSE:
    any was accepted) and 3.1 (`sub` a SPIFFE ID: a string prefix was enough, so `.../../x` passed). The tokens are
    signed by a second JWT authority placed in the agent's trust bundle for the test (as a CA rotation adds one),
    so only the rule under test differs from the token that validates."""
    import base64

    import grpc
    import jwt as pyjwt
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from spiffe._proto import workload_pb2 as pb

    from pki.bundle import jwk_for

    ec_key, ed_key = ec.generate_private_key(ec.SECP256R1()), ed25519.Ed25519PrivateKey.generate()
    extra = [{"use": "jwt-svid", "kid": "test-ec", **jwk_for(ec_key.public_key())},
             {"use": "jwt-svid", "kid": "test-ed", **jwk_for(ed_key.public_key())}]
    now = int(time.time())

    def token(*, sub: str = W1, alg: str = "ES256", typ: str | None = "JWT") -> str:
        headers: dict[str, Any] = {"kid": "test-ed" if alg == "EdDSA" else "test-ec"}
        if typ is not None:
            headers["typ"] = typ
        key = ed_key if alg == "EdDSA" else ec_key
        return pyjwt.encode({"sub": sub, "aud": ["svc"], "exp": now + 300, "iat": now}, key, algorithm=alg,
                            headers=headers)

    bundle = gpu1.identity.bundle
    assert bundle is not None
    gpu1.identity.bundle = {**bundle, "keys": [*bundle["keys"], *extra]}
    channel, stub = _stub(gpu1)
    try:
        with channel:
            def validate(svid: str) -> Any:
                return stub.ValidateJWTSVID(pb.ValidateJWTSVIDRequest(audience="svc", svid=svid), timeout=10,
                                            metadata=HEADER)

            for good in (token(), token(typ="JOSE"), token(typ=None)):
                assert validate(good).spiffe_id == W1
            bad = {
                "EdDSA": token(alg="EdDSA"), "typ": token(typ="at+jwt"), "dot-segment": token(sub=W1 + "/../w2"),
                "query": token(sub=W1 + "?x=1"), "no path": token(sub="spiffe://example.org"),
                "uppercase td": token(sub=W1.replace("example.org", "EXAMPLE.org")),
            }
            for name, svid in bad.items():
                with pytest.raises(grpc.RpcError) as exc:
                    validate(svid)
                assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            unsigned = base64.urlsafe_b64encode(b'{"alg":"none","kid":"test-ec"}').rstrip(b"=").decode()
            with pytest.raises(grpc.RpcError) as exc:
                validate(f"{unsigned}.{token().split('.')[1]}.")
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        gpu1.identity.bundle = bundle


def test_only_the_first_x5c_value_of_a_bundle_key_is_a_root() -> None:
    """X509-SVID spec 6.2: of an x509-svid key's `x5c`, all but the first MUST be ignored; a key without `x5c`,
    or of another `use`, is ignored. Every value used to become a trust anchor of the agent and its workloads."""
    import base64

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from agent.identity import roots_of
    from tests.pki.helpers import self_signed_pem

    def der(pem: str) -> str:
        cert = x509.load_pem_x509_certificate(pem.encode())
        return base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()

    root, other, stray = self_signed_pem("root"), self_signed_pem("other"), self_signed_pem("stray")
    bundle = {"keys": [{"use": "x509-svid", "kty": "EC", "x5c": [der(root), der(other)]},
                       {"use": "x509-svid", "kty": "EC"},
                       {"use": "x509-svid", "kty": "EC", "x5c": []},
                       {"use": "future-svid", "kty": "EC", "x5c": [der(stray)]}]}
    assert [r.subject.rfc4514_string() for r in roots_of(bundle)] == ["CN=root"]
