"""What the `trustfabric lab` commands do, one function each (the CLI parses, calls and prints)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enforcer.fabric import Fabric
from enforcer.fabric_file import load_fabric_file
from lab import build, standalone, state
from lab import probe as probing
from lab.errors import LabError, LabInputError
from lab.topology import topology_digest

MODES = ("standalone", "agent")


def up(home: Path, fabric_file: Path, mode: str = "standalone") -> dict[str, Any]:
    """Build the lab for the file; standalone: compile it and apply every device. A report with timings."""
    if mode not in MODES:
        raise LabInputError(f"mode {mode!r}: one of {', '.join(MODES)}")
    build.require_root()
    timings = build.Timings()
    source = str(Path(fabric_file).resolve())
    if mode == "standalone":
        fabric, compiled, _ = standalone.compile_file(Path(source))  # a bad file fails before anything is made
    else:
        fabric, compiled = load_fabric_file(Path(source)), None
    timings.lap("compile")
    st = build.build(home, fabric, source, mode, timings)
    applied: list[str] = []
    if compiled is not None:
        try:
            applied = standalone.apply(st, fabric, compiled, only_changed=False)
        except BaseException:
            build.teardown(home)
            raise
        state.save(home, st)
        timings.lap("apply")
    return {"lab": st["lab"], "mode": mode, "file": source, "namespaces": len(st["namespaces"]),
            "devices": sorted(st["devices"]), "workloads": len(st["workloads"]), "applied": applied,
            "seconds": timings.total, "steps": timings.steps}


def down(home: Path) -> dict[str, Any]:
    build.require_root(ovs=False)
    return build.teardown(home)


def status(home: Path) -> dict[str, Any]:
    return build.status(home)


def _up_state(home: Path) -> dict[str, Any]:
    st = state.load(home)
    if st is None or st.get("status") != "up":
        raise LabError(f"no lab is up for {home}: `trustfabric lab up FILE.yaml` first")
    return st


def apply(home: Path, fabric_file: Path | None = None) -> dict[str, Any]:
    """Compile the (edited) file again and apply the devices whose rule set changed or that drifted (their
    installed rules changed by hand: `repaired`, each with its differences)."""
    st = _up_state(home)  # no lab: said first, before a tool `lab up` would need anyway
    build.require_root()
    if st["mode"] != "standalone":
        raise LabError("this lab is agent-driven: node agents apply its rule sets")
    source = str(Path(fabric_file).resolve()) if fabric_file else st["file"]
    fabric, compiled, _ = standalone.compile_file(Path(source))
    _same_topology(st, fabric)
    # a device changed by hand since (drift) is applied again even when its rule set did not change
    drift = standalone.drifted(st, fabric, sorted(compiled.devices))
    changed = standalone.apply(st, fabric, compiled, only_changed=True, also=drift)
    st["file"] = source
    state.save(home, st)
    return {"lab": st["lab"], "file": source, "applied": changed, "repaired": drift,
            "unchanged": sorted(set(compiled.devices) - set(changed))}


def _same_topology(st: dict[str, Any], fabric: Fabric) -> None:
    if topology_digest(fabric) != st["topology"]:
        raise LabError("the file's topology (nodes, links, placements, tenant VLANs/VNIs) differs from the lab's: "
                       "`trustfabric lab down` and `lab up` to rebuild it")


def probe(home: Path, src: str, dst: str, port: int, family: int = 4,
          timeout: float = probing.DEFAULT_TIMEOUT) -> probing.ProbeResult:
    st = _up_state(home)
    build.require_root()
    fabric = load_fabric_file(Path(st["file"]))
    _same_topology(st, fabric)
    result = probing.probe(st, standalone.installed(st, fabric), src, dst, port, family, timeout)
    if st["mode"] == "standalone":
        result.stale = stale(st)
    return result


def stale(st: dict[str, Any], now: datetime | None = None) -> list[str]:
    """Why the applied rule sets are no longer what the file says now (no reconciler runs in standalone mode:
    a grant's expiry takes effect at the next `lab apply`): each grant the devices still allow that has expired,
    or, when the file changed otherwise, the devices that differ. Empty: in step."""
    at = now or datetime.now(UTC)
    fabric, compiled, _ = standalone.compile_file(Path(st["file"]), at)
    applied = st.get("applied", {})
    devices = sorted(d for d, rs in compiled.devices.items()
                     if d in applied and applied[d].get("hash") != rs.content_hash)
    if not devices:
        return []
    reasons = {r for d in devices for rule in applied[d]["rules"].get("rules", ()) for r in rule.get("reasons", ())}
    expired = [f"grant {g.id} expired at {g.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
               for g in sorted(fabric.grants, key=lambda g: g.id)
               if g.expires_at <= at and f"grant:{g.id}" in reasons]
    return expired or [f"the file changed since the last apply ({', '.join(devices)})"]
