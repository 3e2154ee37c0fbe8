"""Which backend realises each device this agent serves.

In the lab (`--lab HOME`), the lab's state file in agent mode (`<HOME>/lab/state.json`, the contract
documented in lab/state.py: plain JSON, read here without importing the lab) maps `nic:<node>` to its OVS run
directory, bridge and port names, and `leaf:<name>` to its namespace and wiring. A SuperNIC's backend needs
nothing else; a Linux leaf's also needs the fabric's routing part, which the server serves beside its rule
set (enforcer/leaf_view.py), so it is built per rule set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.identity import AgentError
from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.fabric import Fabric
from enforcer.ovsd import OvsDaemons

LAB_STATE = Path("lab") / "state.json"


@dataclass(frozen=True)
class DeviceWiring:
    device: str
    kind: str  # nic | leaf
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
