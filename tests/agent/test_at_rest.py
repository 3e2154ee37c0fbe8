"""What the agent keeps on disk, against a real server over TLS with py-spiffe as the workload: the node key
is encrypted (an older agent's plaintext key is migrated in place), the key file is its own and checked, and
the workload SVIDs survive a restart sealed, served again only after the server confirmed them: a workload
unplaced or revoked while the agent was down gets nothing, and with the server unreachable a restarted agent
answers UNAVAILABLE instead of serving its cache unconfirmed."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from spiffe import WorkloadApiClient
from spiffe._proto import workload_pb2

from agent.at_rest import AtRestError
from agent.identity import NODE_FILE
from agent.runner import Agent
from agent.svids import CACHE_FILE, PLACEMENTS_WAIT_MAX
from tests.agent.harness import Served, served_fabric, workload_stub

pytestmark = pytest.mark.xdist_group("agent-wlapi")
W1 = "spiffe://example.org/tenant/acme/group/train/w1"
W2 = "spiffe://example.org/tenant/acme/group/train/w2"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_fabric(tmp_path_factory.mktemp("agent-at-rest")) as s:
        for name, port, ipv4 in (("w1", "pf0vf0", "10.1.0.11"), ("w2", "pf0vf2", "10.1.0.12")):
            r = s.env.call("PUT", f"/v1/fabric/placements/acme/train/{name}", "admin", json={
                "node": "gpu1", "port": port, "ipv4": ipv4, "selectors": [f"unix:uid:{os.getuid()}"]})
            assert r.status_code == 200, r.text
        yield s


@pytest.fixture
def sock() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"tfa{os.getpid()}-"))  # short: a unix socket path has 107 bytes
    try:
        yield d / "api.sock"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def start(served: Served, sock: Path) -> Agent:
    old = served.agents.get("gpu1")
    if old is not None:
        old.stop()
    return served.agent("gpu1", socket=sock)


def serials(agent: Agent) -> dict[str, int]:
    assert agent.workload_api is not None
    with WorkloadApiClient(socket_path=f"unix:{agent.workload_api.socket_path}", default_timeout=10) as client:
        return {str(s.spiffe_id): s.leaf.serial_number for s in client.fetch_x509_svids()}


def fetch_code(agent: Agent) -> grpc.StatusCode | None:
    assert agent.workload_api is not None
    with grpc.insecure_channel(f"unix:{agent.workload_api.socket_path}") as ch:
        stub = workload_stub(ch)
        try:
            next(iter(stub.FetchX509SVID(workload_pb2.X509SVIDRequest(), timeout=10,
                                         metadata=[("workload.spiffe.io", "true")])))
        except grpc.RpcError as exc:
            return exc.code()
    return None


def issued(served: Served) -> int:
    r = served.env.call("GET", "/v1/audit/events?action=svid.issue&limit=500", "admin")
    assert r.status_code == 200, r.text
    body = r.json()
    return len(body["items"] if isinstance(body, dict) else body)


def test_the_node_key_is_encrypted_and_its_key_file_is_apart(served: Served, sock: Path) -> None:
    agent = start(served, sock)
    pem = (agent.config.data_dir / NODE_FILE).read_bytes()
    assert b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in pem and b"-----BEGIN PRIVATE KEY-----" not in pem
    with pytest.raises(TypeError):  # no key without the password
        serialization.load_pem_private_key(pem, password=None)
    key_file = agent.config.data_dir.with_name("gpu1.key")
    assert key_file.parent != agent.config.data_dir and len(key_file.read_bytes()) == 32
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert agent.api.placements()  # the encrypted key authenticates
    # the workload keys handed out are in the sealed cache, never readable there
    assert W1 in serials(agent)
    cache = (agent.config.data_dir / CACHE_FILE).read_bytes()
    assert stat.S_IMODE((agent.config.data_dir / CACHE_FILE).stat().st_mode) == 0o600
    for entry in agent.svids._x509.values():
        assert entry.key_der not in cache and entry.key_der[-32:] not in cache
    assert b"acme" not in cache and b"PRIVATE" not in cache


def test_a_plaintext_node_key_is_migrated_and_a_wrong_key_file_refused(served: Served, sock: Path) -> None:
    agent = start(served, sock)
    agent.stop()
    data = agent.config.data_dir
    # what the previous agent wrote: the key in plaintext PKCS#8 (mode 0600), no key file
    sealed = (data / NODE_FILE).read_bytes()
    key = serialization.load_pem_private_key(sealed, password=agent.identity.at_rest.password())
    plain = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    chain = sealed[sealed.index(b"-----BEGIN CERTIFICATE-----"):]
    (data / NODE_FILE).write_bytes(plain + chain)
    key_file = data.with_name("gpu1.key")
    key_file.unlink()
    migrated = start(served, sock)
    pem = (data / NODE_FILE).read_bytes()
    assert b"-----BEGIN PRIVATE KEY-----" not in pem and b"ENCRYPTED PRIVATE KEY" in pem
    assert migrated.identity.svid is not None and migrated.identity.svid.spiffe_id.endswith("/node/gpu1")
    assert migrated.api.placements()
    assert W1 in serials(migrated)  # the old cache (another key) is ignored, not fatal: issued afresh
    migrated.stop()
    # the sealed key without its key file, or with another one: one readable error, nothing overwritten
    saved = key_file.read_bytes()
    key_file.unlink()
    with pytest.raises(AtRestError, match="is missing"):
        Agent(replace(migrated.config, join_token=None))
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o600)
    with pytest.raises(Exception, match="does not open with the agent key file"):
        Agent(replace(migrated.config, join_token=None))
    key_file.chmod(0o644)
    with pytest.raises(AtRestError, match="readable by others"):
        Agent(replace(migrated.config, join_token=None))
    key_file.write_bytes(saved)
    key_file.chmod(0o600)
    assert (data / NODE_FILE).read_bytes() == pem


def test_workload_svids_survive_a_restart_and_are_served_once_confirmed(served: Served, sock: Path) -> None:
    first = start(served, sock)
    before = serials(first)
    assert set(before) == {W1, W2}
    count = issued(served)
    assert count >= 2
    second = start(served, sock)
    assert second.svids.from_cache == 2 and second.svids.synced
    started = time.monotonic()
    assert serials(second) == before  # the same SVIDs: from the cache, not issued again
    took = time.monotonic() - started
    assert issued(served) == count
    assert took < 10.0, took  # synced at start (two small GETs), served from memory: typically ~50 ms


def test_a_workload_unplaced_or_revoked_while_the_agent_was_down_gets_nothing(served: Served, sock: Path) -> None:
    first = start(served, sock)
    assert set(serials(first)) == {W1, W2}
    first.stop()
    r = served.env.call("POST", "/v1/tenants/acme/groups/train/workloads/w2/revoke", "security",
                        json={"reason": "key stolen"})
    assert r.status_code < 300, r.text
    # the revoked workload stays placed: only the CRL says its SVID is void
    again = start(served, sock)
    assert set(serials(again)) == {W1}
    again.stop()
    r = served.env.call("DELETE", "/v1/fabric/placements/acme/train/w1", "admin")
    assert r.status_code == 200, r.text
    try:
        third = start(served, sock)
        assert fetch_code(third) == grpc.StatusCode.PERMISSION_DENIED  # nothing placed here for this caller
        assert not third.svids._x509
    finally:
        r = served.env.call("PUT", "/v1/fabric/placements/acme/train/w1", "admin", json={
            "node": "gpu1", "port": "pf0vf0", "ipv4": "10.1.0.11", "selectors": [f"unix:uid:{os.getuid()}"]})
        assert r.status_code == 200, r.text


def test_a_restart_with_the_server_down_serves_nothing_until_it_answers(served: Served, sock: Path) -> None:
    first = start(served, sock)
    before = serials(first)
    assert W1 in before
    first.stop()
    served.stop()
    try:
        blind = start(served, sock)
        assert blind.svids.from_cache == len(before) and not blind.svids.synced
        assert fetch_code(blind) == grpc.StatusCode.UNAVAILABLE  # "retry": never the unconfirmed cache
    finally:
        served.start()
    # the server answers: the cache confirmed and served, within the floor of the last failed placements read (the
    # Workload API's "retry" until then: no read is sent before it)
    deadline = time.monotonic() + PLACEMENTS_WAIT_MAX * 1.1 + 2.0
    while fetch_code(blind) == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert serials(blind) == before
