"""Which backend realises each device this agent serves.

On a real node (flags or AgentConfig): `--ovs-bridge` drives the node's own Open vSwitch (OVS-DOCA on a
BlueField) bridge through the running daemons' run directory (`--ovs-rundir`, default the system's), as
`nic:<node>`; the fabric's port names are the bridge's unless `--ovs-port FABRIC=BRIDGE` maps them (a
BlueField's representors carry the fabric file's names: p0, pf0vf0, ...). `--nvue URL` drives a Cumulus
leaf's NVUE REST API (revision, PATCH, apply, poll: enforcer/backends/nvue.py) as `leaf:<node>`: the agent
runs on the switch (or beside it) under the leaf's name. Neither touches anything but the flows of that
bridge or the `tf-*`/`vrf<vni>`/subinterface objects of that switch.

In the lab (`--lab HOME`), the lab's state file in agent mode (`<HOME>/lab/state.json`, the contract
documented in lab/state.py: plain JSON, read here without importing the lab) maps `nic:<node>` to its OVS run
directory, bridge and port names, and `leaf:<name>` to its namespace and wiring. A SuperNIC's backend needs
nothing else; a Linux leaf's also needs the fabric's routing part, which the server serves beside its rule
set (enforcer/leaf_view.py), so it is built per rule set.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from agent.identity import AgentError
from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.backends.nvue import NvueBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.fabric import Fabric
from enforcer.ovsd import OvsDaemons

LAB_STATE = Path("lab") / "state.json"


@dataclass(frozen=True)
class DeviceWiring:
    device: str
    kind: str  # nic | leaf (a Linux leaf: it renders from the fabric view) | nvue
    make: Callable[[Fabric | None], Any]  # the fabric view (leaves) -> a Backend (and Counting)


def lab_devices(lab_home: Path, node: str) -> list[DeviceWiring]:
    """The devices named `node` in the lab's state: `nic:<node>`, and `leaf:<node>` when it is a leaf."""
    path = Path(lab_home) / LAB_STATE
    try:
        state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AgentError(f"{path}: no lab here; build one with `trustfabric lab up FILE --mode agent`") from None
    except (OSError, ValueError) as exc:
        raise AgentError(f"{path}: unreadable lab state ({exc})") from None
    if state.get("mode") != "agent":
        raise AgentError(f"{path}: the lab runs in {state.get('mode')} mode; agents need `lab up FILE --mode agent`")
    devices = state.get("devices") or {}
    out = []
    for device in (f"nic:{node}", f"leaf:{node}"):
        d = devices.get(device)
        if d is None:
            continue
        if d["kind"] == "nic":
            backend = OvsBackend(OvsDaemons(Path(d["ovs_rundir"])), str(d["bridge"]), dict(d["port_names"]))

            def nic(_fabric: Fabric | None, b: OvsBackend = backend) -> OvsBackend:
                return b

            out.append(DeviceWiring(device, "nic", nic))
        else:
            netns, wiring = str(d["netns"]), LeafWiring.from_dict(d["wiring"])

            def leaf(fabric: Fabric | None, ns: str = netns, w: LeafWiring = wiring) -> LinuxBackend:
                if fabric is None:
                    raise AgentError("a Linux leaf needs the fabric view to render its routes")
                return LinuxBackend(ns, fabric, w)

            out.append(DeviceWiring(device, "leaf", leaf))
    if not out:
        raise AgentError(f"{path}: the lab has no device nic:{node} or leaf:{node}")
    return out


SYSTEM_OVS_RUNDIR = Path("/var/run/openvswitch")


@dataclass(frozen=True)
class OvsNode:
    """The node's own Open vSwitch bridge (the SuperNIC's OVS-DOCA on a BlueField)."""

    bridge: str
    rundir: Path = SYSTEM_OVS_RUNDIR
    port_names: Mapping[str, str] = field(default_factory=dict)  # fabric port -> bridge port, when they differ


@dataclass(frozen=True)
class NvueLeaf:
    """A Cumulus leaf's NVUE REST API."""

    url: str
    user: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None  # the switch's certificate authority; default the system's


def node_devices(node: str, ovs: OvsNode | None, nvue: NvueLeaf | None) -> list[DeviceWiring]:
    """`nic:<node>` on the node's OVS bridge and/or `leaf:<node>` through NVUE; checked here, so a wrong
    bridge or run directory stops the agent at start with one line instead of failing every apply."""
    out = []
    if ovs is not None:
        mgmt = Path(ovs.rundir) / f"{ovs.bridge}.mgmt"
        if not mgmt.exists():
            raise AgentError(f"--ovs-bridge {ovs.bridge}: no OpenFlow socket {mgmt} (is ovs-vswitchd running with "
                             f"that bridge, and is --ovs-rundir {ovs.rundir} its run directory?)")
        out.append(DeviceWiring(f"nic:{node}", "nic", _fixed(OvsBackend(OvsDaemons(Path(ovs.rundir)), ovs.bridge,
                                                                         dict(ovs.port_names)))))
    if nvue is not None:
        out.append(DeviceWiring(f"leaf:{node}", "nvue", _fixed(_nvue_backend(nvue))))
    return out


def _fixed(backend: Any) -> Callable[[Fabric | None], Any]:
    """A backend that needs no fabric view (a SuperNIC, an NVUE leaf: the switch routes by itself)."""

    def make(_fabric: Fabric | None) -> Any:
        return backend

    return make


def _nvue_backend(leaf: NvueLeaf) -> NvueBackend:
    parts = urlsplit(leaf.url)
    if parts.scheme != "https" and parts.hostname not in ("127.0.0.1", "::1", "localhost"):
        raise AgentError(f"--nvue {leaf.url}: a switch's API is reached over https:// (http:// only on 127.0.0.1)")
    if (leaf.user is None) != (leaf.password_file is None):
        raise AgentError("--nvue-user and --nvue-password-file go together")
    auth = None
    if leaf.user is not None and leaf.password_file is not None:
        try:
            password = Path(leaf.password_file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise AgentError(f"--nvue-password-file {leaf.password_file}: {exc.strerror}") from None
        auth = (leaf.user, password)
    verify: ssl.SSLContext | bool = True
    if leaf.ca_file is not None:
        try:
            verify = ssl.create_default_context(cafile=str(leaf.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise AgentError(f"--nvue-ca {leaf.ca_file}: {exc}") from None
    client = httpx.Client(base_url=leaf.url, auth=auth, verify=verify, timeout=30.0)
    return NvueBackend(leaf.url, client=client)
