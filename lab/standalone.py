"""Standalone mode: the lab compiles its self-contained fabric file itself and applies every device.

Policy data from the file (`enforcer.fabric.policy_data`), the allowed flows from the shipped `rego/`
through the embedded engine (grant expiry judged now), `enforcer.compiler.compile_fabric`, then each
device through its backend (OVS for SuperNICs, Linux for leaves), in parallel. `lab apply` compiles the
edited file again and applies only the devices whose rule set hash differs from the one applied, or whose
device no longer runs what was applied (drift: a flow or rule changed by hand), as an agent repairs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from enforcer.backends.base import Backend, Counting
from enforcer.backends.linux import LeafWiring, LinuxBackend
from enforcer.backends.ovs import OvsBackend
from enforcer.compiler import Compiled, compile_fabric
from enforcer.fabric import Fabric, policy_data, revoked_ids, to_ns
from enforcer.fabric_file import load_fabric_file
from enforcer.ir import DeviceRuleSet
from enforcer.ovsd import OvsDaemons
from lab import netops
from lab.errors import LabError
from policy.decide import ALLOWED_FLOWS_QUERY
from policy.engines import scratch_engine
from policy.shipped import REGO_DIR
from policy.versions import load_dir


@dataclass(frozen=True)
class Installed:
    """The rule sets applied to the lab's devices (what the enforcer's Walker evaluates for a probe)."""

    fabric: Fabric
    devices: dict[str, DeviceRuleSet]


def allowed_flows(fabric: Fabric, now: datetime) -> Any:
    data = policy_data(fabric)
    data["tf"]["now_ns"] = to_ns(now)
    engine = scratch_engine(dict(load_dir(REGO_DIR)), data)
    try:
        return engine.evaluate(ALLOWED_FLOWS_QUERY, {})
    finally:
        engine.close()


def compile_file(path: Path, now: datetime | None = None) -> tuple[Fabric, Compiled, Any]:
    """(fabric, its compile, the allowed flows) for a fabric file; FabricError names a bad line."""
    fabric = load_fabric_file(path)
    allowed = allowed_flows(fabric, now or datetime.now(UTC))
    return fabric, compile_fabric(fabric, allowed, revoked_ids(fabric)), allowed


class LabBackend(Backend, Counting, Protocol):
    """What the lab needs of a device's backend."""


def backend(st: dict[str, Any], device: str, fabric: Fabric) -> LabBackend:
    """The backend attached to one of the lab's devices (as an agent would build it from the state file)."""
    d = st.get("devices", {}).get(device)
    if d is None:
        raise LabError(f"the lab has no device {device}")
    if d["kind"] == "nic":
        return OvsBackend(OvsDaemons(Path(d["ovs_rundir"])), d["bridge"], d["port_names"])
    return LinuxBackend(d["netns"], fabric, LeafWiring.from_dict(d["wiring"]))


def drifted(st: dict[str, Any], fabric: Fabric, devices: list[str]) -> dict[str, list[str]]:
    """The devices among `devices` whose installed rules differ from the rule set recorded as applied, with
    the differences (read back from each device, in parallel)."""
    applied: dict[str, Any] = st.get("applied", {})
    todo = sorted(d for d in devices if d in applied and d in st["devices"])

    def one(device: str) -> list[str]:
        return backend(st, device, fabric).drift(DeviceRuleSet.from_dict(applied[device]["rules"]))

    diffs = netops.parallel([partial(one, d) for d in todo])
    return {d: diff for d, diff in zip(todo, diffs, strict=True) if diff}


def apply(st: dict[str, Any], fabric: Fabric, compiled: Compiled, only_changed: bool,
          also: Iterable[str] = ()) -> list[str]:
    """Apply the compiled rule sets (all, or those whose hash differs from the applied one, and the devices
    in `also`: drifted ones), in parallel; record what was applied in `st`. The devices applied, sorted."""
    applied: dict[str, Any] = st.setdefault("applied", {})
    forced = set(also)
    todo = sorted(d for d, rs in compiled.devices.items()
                  if d in st["devices"] and (not only_changed or d in forced
                                             or applied.get(d, {}).get("hash") != rs.content_hash))

    def one(device: str) -> str:
        return backend(st, device, fabric).apply(compiled.devices[device])

    hashes = netops.parallel([partial(one, d) for d in todo])
    for device, digest in zip(todo, hashes, strict=True):
        applied[device] = {"hash": digest, "rules": compiled.devices[device].to_dict()}
    return todo


def installed(st: dict[str, Any], fabric: Fabric) -> Installed:
    return Installed(fabric, {d: DeviceRuleSet.from_dict(a["rules"]) for d, a in st.get("applied", {}).items()})
