"""The lab's state file, `<TRUSTFABRIC_HOME>/lab/state.json`: what `lab up` made and, in standalone mode,
the rule set applied to each device. It is also the contract with node agents (agent mode): `devices`
maps each enforcer device id to what a backend needs to attach to it, in plain JSON:

    "nic:<node>":  {"kind": "nic", "ovs_rundir", "ovs_netns", "bridge", "port_names": {IR port: OVS port}}
                   -> enforcer.backends.ovs.OvsBackend(OvsDaemons(ovs_rundir), bridge, port_names)
    "leaf:<name>": {"kind": "leaf", "netns", "wiring": LeafWiring.to_dict()}
                   -> enforcer.backends.linux.LinuxBackend(netns, fabric, LeafWiring.from_dict(wiring))

Written atomically (temporary file + rename), mode 0600; it holds no secret.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lab.errors import LabError

STATE_VERSION = 1


def state_path(home: Path) -> Path:
    return Path(home) / "lab" / "state.json"


def load(home: Path) -> dict[str, Any] | None:
    path = state_path(home)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"{path}: unreadable lab state ({exc}); `trustfabric lab down` removes the lab") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise LabError(f"{path}: not a lab state of this version; `trustfabric lab down` removes the lab")
    return data


def save(home: Path, state: dict[str, Any]) -> None:
    path = state_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**state, "version": STATE_VERSION}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove(home: Path) -> None:
    state_path(home).unlink(missing_ok=True)
