"""Policy operations the API and the CLI both run, with the deployment's rules applied (issue 13, item 5 and
the policy "should fix" items):

- user-supplied Rego (validate, test, upload, impact, a query on a stored version) is evaluated only in the
  policy sandbox, with the configured CPU and memory limits (policy/sandbox.py), never in the serving
  process; the functions it runs are policy/authoring.py's (the offline CLI's `policy validate|test` run
  those same functions in-process, on the operator's own files);
- activation and rollback: tests present and passing, a signature (always outside development mode,
  and whenever keys are configured), the two-person rule when on, then the decision budget measured on
  the current data in the sandbox (policy/budget.py), then the switch in one write transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Literal

from audit import Actor
from policy import authoring, budget, service
from policy.authoring import PreparedVersion
from policy.budget import DecisionBudget
from policy.data import build_data, to_ns
from policy.impact import ImpactReport, impact_of
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


def impact(ctx: AppContext, ref: str | int) -> ImpactReport:
    """Flows the version opens and closes against the active one, on the current inventory (in the sandbox)."""
    now = ctx.clock()
    with ctx.db.read_session() as session:
        candidate = service.get_version(session, ref)
        current = service.active_version(session)
        data = build_data(session, now)
        args = (dict(candidate.modules), candidate.content_hash,
                dict(current.modules) if current is not None else None,
                current.content_hash if current is not None else None, data, to_ns(now))
    return run_limited(impact_of, *args, limits=limits(ctx.settings), what="the impact report")


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
        service.preflight(target, actor, signature, rules)  # refuse cheaply before measuring anything
        modules, number = dict(target.modules), target.number
        data = build_data(session, now)
    costs = run_limited(budget.measure, modules, data, to_ns(now), limits=limits(settings),
                        what=f"the activation check of policy version {number}")
    budget.check(costs, decision_budget(settings), number)
    with ctx.db.session() as session:
        fn = service.activate if kind == "activate" else service.rollback
        return fn(session, ref, actor, now=ctx.clock(), signature=signature, reason=reason, rules=rules)
