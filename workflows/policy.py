"""Policy operations the API and the CLI both run, with the deployment's rules applied (issue 13, item 5 and
the policy "should fix" items):

- user-supplied Rego (validate, test, upload, impact, a query on a stored version) is evaluated only in the
  policy sandbox, with the configured CPU and memory limits (policy/sandbox.py), never in the serving
  process; the functions it runs are policy/authoring.py's (the offline CLI's `policy validate|test` run
  those same functions in-process, on the operator's own files);
- activation and rollback: tests present and passing, a signature (always outside development mode,
  and whenever keys are configured), the two-person rule when on, then the decision budget measured on
  the current data in the sandbox (policy/budget.py), then the switch in one write transaction;
- activation (not rollback) also needs the version's `decision` to agree with its `allowed_flows` on the flows
  it changes and a sample (policy/consistency.py, in the same sandbox job as the budget). A rollback goes back
  to a version that was in force before: the way out of a bad version stays open during an incident (blocking
  it would keep the bad version in force, the opposite of failing closed); its impact report still shows any
  disagreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Literal

from audit import Actor
from policy import authoring, budget, service
from policy.authoring import PreparedVersion
from policy.budget import DecisionBudget, DecisionCosts
from policy.consistency import Consistency
from policy.data import build_data, to_ns
from policy.errors import PolicyInconsistent
from policy.impact import checked_report
from policy.models import PolicyVersion
from policy.sandbox import Limits, run_limited
from policy.service import SwitchRules
from policy.testing import TestReport
from policy.versions import load_verify_keys
from workflows.context import AppContext
from workflows.settings import Settings


def limits(settings: Settings) -> Limits:
    return Limits(cpu_seconds=settings.policy_job_cpu_seconds, memory_mb=settings.policy_job_memory_mb,
                  workers=settings.policy_job_workers)


def decision_budget(settings: Settings) -> DecisionBudget:
    return DecisionBudget(decision_ms=settings.policy_decision_budget_ms,
                          flow_set_ms=settings.policy_flow_set_budget_ms)


def switch_rules(settings: Settings) -> SwitchRules:
    return SwitchRules(verify_keys=load_verify_keys(settings.policy_verify_keys),
                       require_signature=settings.require_policy_signature, two_person=settings.policy_two_person)


def validate(settings: Settings, modules: Mapping[str, str]) -> str:
    """The content hash once every module compiles (in the sandbox)."""
    return run_limited(authoring.validate, dict(modules), limits=limits(settings), what="policy validation")


def test(settings: Settings, modules: Mapping[str, str]) -> TestReport:
    """The Rego unit tests' report (in the sandbox)."""
    return run_limited(authoring.test, dict(modules), limits=limits(settings), what="policy tests")


def prepare(settings: Settings, modules: Mapping[str, str]) -> PreparedVersion:
    """Compiled and tested, ready for service.upload (in the sandbox, before any write transaction)."""
    return run_limited(authoring.prepare, dict(modules), limits=limits(settings), what="the policy upload")


def evaluate(settings: Settings, modules: Mapping[str, str], query: str, *, input: Any = None,
             data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`opa eval` of `query` over stored modules and the live data (in the sandbox): authoring.evaluate_query's
    result."""
    run = partial(authoring.evaluate_query, input=input, data=dict(data or {}))
    return run_limited(run, dict(modules), query, limits=limits(settings), what="the query")


def allowed_flows(versions: list[dict[str, str] | None], data: dict[str, Any], now_ns: int, *, limits: Limits,
                  what: str) -> list[Any]:
    """`data.flows.allowed_flows` of each version's modules (None: nothing allowed) on `data`, in one sandbox
    job: the staged plan's and the impact report's candidates (workflows/impacts.py) are user-supplied Rego."""
    from enforcer.reconcile import allowed_flows_under

    return run_limited(allowed_flows_under, versions, data, now_ns, limits=limits, what=what)


def activation_checks(modules: Mapping[str, str], active: Mapping[str, str] | None, data: Mapping[str, Any],
                      now_ns: int) -> tuple[DecisionCosts, Consistency]:
    """The decision budget (measured first, on a quiet engine) and the consistency check of a version to be
    activated against the active one (None: nothing active), in one sandbox job."""
    costs = budget.measure(modules, data, now_ns)
    report = checked_report(modules, "", active, None, None, data, now_ns)[2]
    return costs, report.consistency or Consistency()


def switch(
    ctx: AppContext, kind: Literal["activate", "rollback"], ref: str | int, actor: Actor, *,
    signature: str | None, reason: str | None,
) -> PolicyVersion:
    """Put a version in force (activate) or go back to an earlier one (rollback) under the deployment's
    rules; the decision budget is measured before the write transaction opens."""
    settings = ctx.settings
    rules = switch_rules(settings)
    now = ctx.clock()
    with ctx.db.read_session() as session:
        target = service.get_version(session, ref)
        if kind == "rollback":  # a version that is no rollback at all says so, whatever its tests
            service.check_rollback(session, target)
        service.preflight(target, actor, signature, rules)  # refuse cheaply before measuring anything
        modules, number = dict(target.modules), target.number
        current = service.active_version(session)
        # the active version only chooses which flows are checked (those the change opens or closes): one that
        # changes before the switch below leaves the check as sound, its diff part aimed at the older version
        active = dict(current.modules) if current is not None and current.number != number else None
        data = build_data(session, now)
    if kind == "activate":
        costs, consistency = run_limited(activation_checks, modules, active, data, to_ns(now), limits=limits(settings),
                                         what=f"the activation check of policy version {number}")
    else:
        costs = run_limited(budget.measure, modules, data, to_ns(now), limits=limits(settings),
                            what=f"the activation check of policy version {number}")
    budget.check(costs, decision_budget(settings), number)
    if kind == "activate" and consistency.disagreements:
        n = len(consistency.disagreements)
        raise PolicyInconsistent(
            f"policy version {number} is not activated: its decision (what explain shows) and its allowed_flows (what "
            f"the devices enforce) disagree on {n} flow{'s' if n != 1 else ''} of {consistency.checked} checked: "
            f"{consistency.summary()} (`trustfabric policy impact {number}` lists them)")
    with ctx.db.session() as session:
        fn = service.activate if kind == "activate" else service.rollback
        return fn(session, ref, actor, now=ctx.clock(), signature=signature, reason=reason, rules=rules)
