"""A real node's devices, driven by the installed `trustfabric agent` binary against a real server over TLS:
- `--ovs-bridge/--ovs-rundir/--ovs-port`: an Open vSwitch started by the test in a run directory of its own
  stands in for the node's (OVS-DOCA speaks the same OpenFlow); its bridge ports carry other names than the
  fabric's, mapped by --ovs-port. The agent applies nic:gpu1's rule set, the server sees it in sync, the
  bridge's flows are exactly the rendered set, and a hand edit is repaired.
- `--nvue`: a Cumulus leaf cannot exist here; the NVUE stand-in the enforcer's tests use (revisions, PATCH,
  apply, each revision validated against NVUE's schema for what we emit and the switch's ports) plays
  leaf1's API. The agent applies leaf:leaf1 through it, the server sees it in sync, and an object deleted on
  the switch by hand comes back.
- Flags that contradict each other are one line and exit 2."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.backends.nvue import managed
from enforcer.backends.ovs import OvsBackend
from enforcer.ir import DeviceRuleSet
from enforcer.ovsd import OvsDaemons
from enforcer.render.nvue import render_nvue
from tests.agent.harness import Served, served_fabric
from tests.agent.process import BIN, AgentProcess
from tests.enforcer.conftest import ovs_daemons  # noqa: F401 (the session's private Open vSwitch)
from tests.enforcer.nvue_standin import NvueStandIn

pytestmark = pytest.mark.xdist_group("agent-real-node")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_fabric(tmp_path_factory.mktemp("agent-real-node")) as s:
        yield s


def desired(served: Served, device: str) -> DeviceRuleSet:
    r = served.env.call("GET", f"/v1/devices/{device}/ruleset", "admin")
    assert r.status_code == 200, r.text
    return DeviceRuleSet.from_dict(r.json()["ir"])


def test_the_agent_drives_a_nodes_own_ovs_bridge(served: Served, ovs_daemons: OvsDaemons,  # noqa: F811
                                                  tmp_path: Path) -> None:
    tok = secrets.token_hex(3)
    bridge = f"tfn{tok}"
    ovs_daemons.add_bridge(bridge)
    agent = None
    try:
        rules = desired(served, "nic:gpu1")
        names = {rules.uplink: f"tn{tok}u"} | {p.name: f"tn{tok}{i}" for i, p in enumerate(rules.ports)}
        for n in names.values():
            ovs_daemons.add_port(bridge, n, internal=True)
        agent = AgentProcess(served, "gpu1", tmp_path / "logs", "--ovs-bridge", bridge, "--ovs-rundir",
                             str(ovs_daemons.rundir), *(f"--ovs-port={k}={v}" for k, v in names.items()))
        agent.start()
        agent.wait(lambda: agent.in_sync("nic:gpu1"), "nic:gpu1 applied to the node's bridge and reported")
        # read back independently: the bridge runs exactly the rendered set, under the bridge's port names
        reader = OvsBackend(OvsDaemons(ovs_daemons.rundir), bridge, names)
        assert reader.drift(rules) == []
        # someone replaces the flows by hand: the agent restores them
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", ovs_daemons.mgmt(bridge)], check=True,
                       capture_output=True, env=ovs_daemons.env, timeout=30)
        assert reader.drift(rules)
        agent.wait(lambda: not reader.drift(rules), "the hand edit repaired")
    finally:
        if agent is not None:
            agent.stop()
        ovs_daemons.del_bridge(bridge)


def test_the_agent_drives_a_leaf_through_nvue(served: Served, tmp_path: Path) -> None:
    with NvueStandIn(ports=("swp1", "swp2", "swp31")) as switch:
        password = tmp_path / "nvue.password"
        password.write_text("not-a-real-password\n")
        password.chmod(0o600)
        agent = AgentProcess(served, "leaf1", tmp_path / "logs", "--nvue", switch.url, "--nvue-user", "cumulus",
                             "--nvue-password-file", str(password))
        try:
            agent.start()
            agent.wait(lambda: agent.in_sync("leaf:leaf1"), "leaf:leaf1 applied through NVUE and reported")
            rules = desired(served, "leaf:leaf1")
            want = render_nvue(rules)
            with switch.lock:
                assert managed(switch.applied) == want
                assert switch.applied["system"] == {"hostname": "leaf"}  # not ours: untouched
                revisions = len(switch.revisions)
                # someone deletes one of our ACLs on the switch
                acl = sorted(switch.applied["acl"])[0]
                del switch.applied["acl"][acl]
                for body in switch.applied.get("interface", {}).values():
                    body.get("acl", {}).pop(acl, None)
            def restored() -> bool:
                with switch.lock:
                    return managed(switch.applied) == want

            agent.wait(restored, "the deleted ACL restored through a new revision")
            assert len(switch.revisions) > revisions
            assert all(r["state"] == "applied" for r in switch.revisions.values())
        finally:
            agent.stop()


@pytest.mark.parametrize(("extra", "says"), [
    (["--lab", "DIR", "--ovs-bridge", "br-int"], "give one or the other"),
    (["--ovs-port", "p0=p0"], "need --ovs-bridge"),
    (["--nvue", "https://leaf1:8765", "--nvue-user", "cumulus"], "together"),
    (["--nvue", "http://leaf1:8765"], "https://"),
])
def test_contradicting_device_flags_are_one_line(tmp_path: Path, extra: list[str], says: str) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not used\n")
    argv = [BIN, "agent", "--node", "gpu1", "--server", "https://127.0.0.1:9", "--ca", str(ca), "--data-dir",
            str(tmp_path / "data"), *(str(tmp_path) if a == "DIR" else a for a in extra)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "data").exists()


def test_a_metrics_address_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """`--metrics` on a busy port ended in `error: OSError: [Errno 98] Address already in use` (naming neither the
    option nor the address) after the agent had attested and started its devices (review)."""
    import socket

    ca = tmp_path / "ca.pem"
    ca.write_text("not used\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([BIN, "agent", "--node", "gpu1", "--server", "https://127.0.0.1:9", "--ca", str(ca),
                            "--join-token", "tfjt_" + "a" * 43, "--data-dir", str(tmp_path / "data"),
                            "--metrics", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("content", [
    "", "not a certificate\n", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_a_ca_file_without_a_certificate_is_one_line_naming_it(tmp_path: Path, content: str) -> None:
    """`--ca` holding no PEM certificate surfaced at the first request as `https://HOST:PORT: SSLError: no start
    line: cadata does not contain a certificate`, naming the server, after the key file was made (review)."""
    ca = tmp_path / "ca.pem"
    ca.write_text(content)
    r = subprocess.run([BIN, "agent", "--node", "gpu1", "--server", "https://127.0.0.1:9", "--ca", str(ca),
                        "--join-token", "tfjt_" + "a" * 43, "--data-dir", str(tmp_path / "data")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"--ca {ca}: no PEM certificate in it" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "data.key").exists()
