"""The enforcer as the API and the CLI run it: the configured reconciler, plans (against what devices last
applied, or a staged candidate policy), the equivalence check of the published rule sets, rendering a
device's rule set in its native formats, and the policy impact report computed afresh (its per-device
section is workflows/impacts.py's).

Apply and rollback semantics (README "Fabric and enforcer"): devices are agent-managed. Node agents (on each
SuperNIC, and in the lab on the leaves too; a real switch runs the same agent on its Cumulus Linux with the
NVUE backend) pull their desired version over the device API, apply it atomically with the pure renderers and
their backend, and report what they applied. `auto` mode publishes every recompile; `manual` keeps it as a
pending plan until `enforcer apply` publishes it. `enforcer plan` diffs a fresh compile against what each
device last applied (against its desired version when it never reported). `enforcer rollback --device D
--to V` publishes V's content as a new version and pins D; auto mode leaves a pinned device alone until
`enforcer apply --device D` unpins it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from enforcer import service
from enforcer.equivalence import verify as equivalence
from enforcer.fabric import Fabric
from enforcer.ir import DeviceRuleSet
from enforcer.plan import DevicePlan, plan
from enforcer.reconcile import (
    EnforcerConfig,
    Reconciler,
    staged_compile,
    staged_inputs,
    with_devices,
)
from workflows.context import AppContext
from workflows.policy import allowed_flows, limits

FORMATS = ("openflow", "nvue", "nv-set", "nft", "ir")


def make_reconciler(ctx: AppContext) -> Reconciler:
    """The reconciler the settings describe: mode, budget, poll and resync intervals, the `enforcer` engine."""
    s = ctx.settings
    config = EnforcerConfig(mode=s.enforcer_mode, budget=s.budget(), poll_seconds=s.enforcer_poll_seconds,
                            resync_seconds=s.enforcer_resync_seconds)
    return Reconciler(ctx.db, engine_factory=lambda: ctx.engine("enforcer"), config=config, clock=ctx.clock)


def plans(ctx: AppContext, reconciler: Reconciler, staged: str | None = None) -> list[DevicePlan]:
    """Per changed device: a fresh compile (or candidate version `staged`, compiled without publishing) against
    what the device last applied; either way a device over its budget is fitted as auto mode publishes it, its
    withheld entries shown per tenant."""
    if staged is None:
        compiled, _ = reconciler.compile_now()  # devices over budget fitted (enforcer.fairshare)
        fits = reconciler.fits
    else:
        from policy.service import get_version

        with ctx.db.read_session() as session:
            modules = dict(get_version(session, staged).modules)
            inputs = staged_inputs(session, ctx.clock())
        [allowed] = allowed_flows([modules], inputs.data, inputs.now_ns, limits=limits(ctx.settings),
                                  what=f"the staged compile of policy version {staged}")
        # fitted as the reconciler fits it, so the plan says what auto mode would publish under the candidate
        compiled, fits = staged_compile(ctx.db, inputs, allowed, reconciler.config.budget)
    new = compiled.devices
    withheld = {d: tuple((w.tenant, len(w.entries), w.cost) for w in f.withheld) for d, f in fits.items()
                if f.withheld}
    with ctx.db.read_session() as session:
        old = service.last_applied(session)
    return plan(old, new, reconciler.config.budget, withheld)


@dataclass(frozen=True)
class Finding:
    device: str
    problem: str


def verify_published(ctx: AppContext, reconciler: Reconciler) -> tuple[list[Finding], list[Any]]:
    """(integrity findings, equivalence mismatches) of the published rule sets against the active policy: a
    device without a published set or whose stored set does not hash to its recorded hash is a finding; the
    rest are walked flow by flow (enforcer.equivalence) against the policy's answer."""
    compiled, inputs = reconciler.compile_now()
    findings: list[Finding] = []
    with ctx.db.read_session() as session:
        states = service.states(session)
        published: dict[str, DeviceRuleSet] = {}
        for device in sorted(compiled.devices):
            st = states.get(device)
            if st is None or st.version == 0 or not st.in_fabric:
                findings.append(Finding(device, "no published rule set"))
                continue
            row = service.version_row(session, device, st.version)
            rs = service.ruleset_of(row)
            if rs.content_hash != row.content_hash:
                findings.append(Finding(device, f"stored rule set v{row.version} hashes to {rs.content_hash[:16]}, "
                                                f"not its recorded {row.content_hash[:16]} (altered)"))
            published[device] = rs
    if findings:
        return findings, []
    return findings, equivalence(with_devices(compiled, published), inputs.allowed)


KIND_FORMATS = {"nic": ("openflow", "ir"), "leaf": ("nvue", "nv-set", "nft", "ir")}  # what each device renders


def check_format(device: str, kind: str, fmt: str) -> None:
    """InvalidInput unless `fmt` is one of FORMATS that a device of `kind` (nic, leaf) renders in. Reads nothing:
    the kind is the device name's prefix, so the CLI asks it before any work (a usage error there)."""
    if fmt not in FORMATS:
        from core.errors import InvalidInput

        raise InvalidInput(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt not in KIND_FORMATS[kind]:
        from core.errors import InvalidInput

        raise InvalidInput(f"{device} is a {'SuperNIC' if kind == 'nic' else 'leaf'}: --format {fmt} does not "
                           f"apply (use {', '.join(KIND_FORMATS[kind])})")


def render(rs: DeviceRuleSet, fmt: str, fabric: Fabric) -> str:
    """A device's rule set in one of FORMATS (the pure renderers the agents run)."""
    check_format(rs.device, rs.kind, fmt)
    if fmt == "ir":
        return json.dumps(rs.to_dict(), indent=2, sort_keys=True) + "\n"
    if fmt == "openflow":
        from enforcer.render.openflow import render_openflow

        return render_openflow(rs)
    if fmt == "nvue":
        from enforcer.render.nvue import nvue_yaml

        return nvue_yaml(rs)
    if fmt == "nv-set":
        from enforcer.render.nvue import nv_set_commands

        return "".join(c + "\n" for c in nv_set_commands(rs))
    if fmt == "nft":
        from enforcer.render.linux import render_linux

        cfg = render_linux(rs, fabric)
        return json.dumps({"nftables": cfg.nft, "ip_rules": list(cfg.ip_rules), "routes": list(cfg.routes)},
                          indent=2, sort_keys=True) + "\n"
    raise AssertionError(f"unreachable: {fmt!r} passed check_format")


def impact(ctx: AppContext, ref: str | int, *, limit: int | None) -> dict[str, Any]:
    """The impact report of version `ref` (flows opened and closed; the per-device section when a fabric exists,
    `devices`: null otherwise), computed afresh: workflows/impacts.py, the candidate in the policy sandbox."""
    from workflows.impacts import compute
    from workflows.policy import limits

    return compute(ctx.db, str(ref), now=ctx.clock(), budget=ctx.settings.budget(),
                   limits=limits(ctx.settings)).to_dict(limit)
