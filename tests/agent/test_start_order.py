"""A node agent whose devices cannot be attached (`--lab` naming no lab, a lab in standalone mode, an
`--ovs-bridge` with no OpenFlow socket) stops with its one-line error before it attests: the one-time join
token is not spent on a start that cannot serve (review: `agent --lab DIR` with no lab there attested, spending
the token, then stopped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.identity import AgentError
from agent.runner import Agent, AgentConfig
from agent.wiring import OvsNode
from tests.agent.harness import Served, served_fabric


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_fabric(tmp_path_factory.mktemp("agent-start-order")) as s:
        yield s


@pytest.mark.parametrize("devices", ["no lab", "missing bridge"])
def test_unattachable_devices_spend_no_join_token(served: Served, tmp_path: Path, devices: str) -> None:
    token = served.join_token("gpu1")
    extra: dict[str, Any] = {"lab_home": tmp_path / "nolab"} if devices == "no lab" else {
        "ovs": OvsNode(bridge="br-missing", rundir=tmp_path / "ovs")}
    agent = Agent(AgentConfig(node="gpu1", server=served.url, ca_file=served.tls.ca_file, data_dir=tmp_path / "data",
                              join_token=token, **extra))
    with pytest.raises(AgentError, match=r"no lab here|no OpenFlow socket"):
        agent.start()
    agent.stop()
    assert not (tmp_path / "data" / "node.pem").exists()
    # the token is still good: the same node attests with it once started right
    again = Agent(AgentConfig(node="gpu1", server=served.url, ca_file=served.tls.ca_file, data_dir=tmp_path / "ok",
                              join_token=token))
    try:
        again.ensure_identity()
        assert again.identity.svid is not None
    finally:
        again.stop()
