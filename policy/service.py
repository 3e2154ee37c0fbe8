"""Policy versions: upload -> compile -> Rego unit tests -> impact report -> activate -> rollback.

Every state change appends its audit event through `audit.record` in the caller's transaction, so the
change and its event commit together or not at all. Nothing is stored for a version that does not compile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import text
from sqlmodel import Session, col, select

from audit import Actor, record
from core.digits import is_digits
from core.errors import Conflict, InvalidInput, NotFound
from core.rocev2 import is_rocev2
from policy import reads
from policy.authoring import PreparedVersion as PreparedVersion
from policy.authoring import evaluate_query as evaluate_query
from policy.authoring import prepare as prepare
from policy.authoring import test as test
from policy.authoring import validate as validate
from policy.data import build_data, to_ns
from policy.decide import FlowDecision, decide_flow, flow_input, parse_identity
from policy.engines import PolicyEngine, scratch_engine
from policy.errors import PolicyTestsFailed, SignatureRequired, TwoPersonRule
from policy.impact import ImpactReport, impact_of
from policy.models import PolicyVersion
from policy.versions import verify_signature

if TYPE_CHECKING:
    from policy.versions import VerifyKey

log = logging.getLogger(__name__)

OBJECT_TYPE = "policy_version"
# validate, test, prepare and evaluate_query need no database: they live in policy/authoring.py (the offline
# CLI commands import that alone) and are this module's API too (re-exported above).


def upload(
    session: Session,
    modules: Mapping[str, str] | PreparedVersion,
    actor: Actor,
    *,
    now: datetime,
    note: str = "",
) -> tuple[PolicyVersion, bool]:
    """Store a candidate version with its test results; (version, created). Uploading content that is
    already stored returns that version unchanged (created False, no audit event). Nothing is stored
    for modules that do not compile."""
    prepared = modules if isinstance(modules, PreparedVersion) else prepare(modules)
    mods, digest, report = prepared.modules, prepared.content_hash, prepared.report
    existing = session.exec(select(PolicyVersion).where(col(PolicyVersion.content_hash) == digest)).first()
    if existing is not None:
        return existing, False
    version = PolicyVersion(
        content_hash=digest,
        modules=mods,
        tests=[r.to_dict() for r in report.results],
        tests_passed=report.passed,
        state="candidate",
        uploaded_by=actor.id,
        note=note[:2000],
        created_at=now,
    )
    session.add(version)
    session.flush()
    record(
        session,
        actor=actor,
        action="policy.upload",
        object_type=OBJECT_TYPE,
        object_id=str(version.number),
        summary={
            "number": version.number,
            "content_hash": digest,
            "modules": sorted(mods),
            "tests_total": len(report.results),
            "tests_failing": report.failing,
        },
        at=now,
    )
    return version, True


def list_versions(session: Session) -> list[PolicyVersion]:
    """Every version, oldest first (the SQL is policy/reads.py's, which the CLI's read-only path runs too)."""
    return list(session.scalars(select(PolicyVersion).from_statement(text(reads.LIST_VERSIONS))).all())


def get_version(session: Session, ref: str | int) -> PolicyVersion:
    """By number ('3') or by content-hash prefix (at least 8 hex characters); NotFound otherwise."""
    text = str(ref).strip()
    if is_digits(text):
        found = session.get(PolicyVersion, int(text))
        if found is None:
            raise NotFound(f"policy version {text} does not exist")
        return found
    if len(text) >= 8 and all(c in "0123456789abcdef" for c in text.lower()):
        rows = session.exec(
            select(PolicyVersion).where(col(PolicyVersion.content_hash).startswith(text.lower()))
        ).all()
        if len(rows) == 1:
            return rows[0]
        if len(rows) > 1:
            raise InvalidInput(f"hash prefix {text} is ambiguous: give more characters")
        raise NotFound(f"no policy version has a content hash starting with {text}")
    raise InvalidInput(f"{text!r} is neither a version number nor a content-hash prefix (8+ hex characters)")


def active_version(session: Session) -> PolicyVersion | None:
    return session.exec(select(PolicyVersion).where(col(PolicyVersion.state) == "active")).first()


def impact(session: Session, ref: str | int, *, now: datetime) -> ImpactReport:
    """Flows the version would open and close against the active one, on the current inventory."""
    candidate = get_version(session, ref)
    current = active_version(session)
    data = build_data(session, now)
    return impact_of(
        candidate.modules,
        candidate.content_hash,
        current.modules if current is not None else None,
        current.content_hash if current is not None else None,
        data,
        to_ns(now),
    )


@dataclass(frozen=True)
class SwitchRules:
    """What activation (and rollback) demands beyond passing tests, as the deployment configures it."""

    verify_keys: Sequence[VerifyKey] = ()  # security-team keys; with any, a valid signature is required
    require_signature: bool = False  # a signature is required even when no key is configured (refused then)
    two_person: bool = False  # the version's uploader cannot put it in force


def preflight(target: PolicyVersion, actor: Actor, signature: str | None, rules: SwitchRules) -> str | None:
    """The checks a version must pass to be put in force, cheapest first; the fingerprint of the key that
    signed it (None when signing is off). PolicyTestsFailed, SignatureRequired or TwoPersonRule otherwise."""
    if not target.tests:
        raise PolicyTestsFailed([], f"policy version {target.number} carries no Rego tests: a version needs at "
                                    "least one test_* rule, and every one passing, to be activated")
    if not target.tests_passed:
        failing = [str(t["name"]) for t in target.tests if not t.get("passed")]
        raise PolicyTestsFailed(failing or ["(unknown)"])
    if rules.two_person and actor.id == target.uploaded_by:
        raise TwoPersonRule(f"two-person rule: policy version {target.number} was uploaded by {actor.id}; "
                            "someone else must put it in force")
    if rules.require_signature and not rules.verify_keys:
        raise SignatureRequired(
            f"activation requires a security-team signature over the content hash {target.content_hash}, and no "
            "policy signing key is configured (TRUSTFABRIC_POLICY_VERIFY_KEYS; or run in development mode)")
    return verify_signature(target.content_hash, signature or target.signature, rules.verify_keys)


def _switch(
    session: Session,
    target: PolicyVersion,
    actor: Actor,
    action: str,
    *,
    now: datetime,
    signature: str | None,
    verify_keys: Sequence[VerifyKey],
    reason: str | None,
    rules: SwitchRules | None,
) -> PolicyVersion:
    rules = rules if rules is not None else SwitchRules(verify_keys=verify_keys)
    signed_by = preflight(target, actor, signature, rules)
    # Lock every version row and read its latest committed state (not only the rows that were active
    # in this transaction's snapshot): a concurrent activation that committed while we waited for the
    # lock is seen and retired here, so exactly one version is ever active.
    locked = session.exec(
        select(PolicyVersion).with_for_update().execution_options(populate_existing=True)
    ).all()
    previous = [p for p in locked if p.state == "active"]
    if any(p.number == target.number for p in previous):
        raise Conflict(f"policy version {target.number} is already active")
    for p in previous:
        p.state = "retired"
        session.add(p)
    target.state = "active"
    target.activated_at = now
    if signed_by is not None:
        target.signature = signature or target.signature
        target.signed_by = signed_by
    session.add(target)
    session.flush()
    record(
        session,
        actor=actor,
        action=action,
        object_type=OBJECT_TYPE,
        object_id=str(target.number),
        summary={
            "number": target.number,
            "content_hash": target.content_hash,
            "previous": [p.number for p in previous],
            "previous_hash": previous[0].content_hash if previous else None,
            "signed_by": signed_by,
        },
        reason=reason,
        at=now,
    )
    return target


def activate(
    session: Session,
    ref: str | int,
    actor: Actor,
    *,
    now: datetime,
    signature: str | None = None,
    verify_keys: Sequence[VerifyKey] = (),
    reason: str | None = None,
    rules: SwitchRules | None = None,
) -> PolicyVersion:
    """Make a version the one in force. It must carry tests, all passing; with verify keys configured, a
    valid signature over its content hash is required (SignatureRequired otherwise); `rules` (the
    deployment's, which then carry the keys) may demand a signature and a second person."""
    return _switch(
        session, get_version(session, ref), actor, "policy.activate",
        now=now, signature=signature, verify_keys=verify_keys, reason=reason, rules=rules,
    )


def check_rollback(session: Session, target: PolicyVersion) -> None:
    """Conflict unless `target` is older than the active version. Checked before anything else about the target
    (preflight's tests and signature): a version that is no rollback at all is refused as that, not for its tests."""
    current = active_version(session)
    if current is None:
        raise Conflict("no policy version is active: activate one instead of rolling back")
    assert target.number is not None and current.number is not None
    if target.number >= current.number:
        raise Conflict(f"rollback goes to an earlier version: version {target.number} is not older than the active "
                       f"version {current.number}")


def rollback(
    session: Session,
    ref: str | int,
    actor: Actor,
    *,
    now: datetime,
    signature: str | None = None,
    verify_keys: Sequence[VerifyKey] = (),
    reason: str | None = None,
    rules: SwitchRules | None = None,
) -> PolicyVersion:
    """Go back to an earlier version (lower number than the active one); same checks as activate."""
    target = get_version(session, ref)
    check_rollback(session, target)
    return _switch(
        session, target, actor, "policy.rollback",
        now=now, signature=signature, verify_keys=verify_keys, reason=reason, rules=rules,
    )


def engine_for_active(session: Session, now: datetime) -> tuple[PolicyEngine, str | None]:
    """An embedded engine loaded with the active version and the current data (no policy: empty engine)."""
    current = active_version(session)
    data = build_data(session, now)
    if current is None:
        return scratch_engine({}, data), None
    return scratch_engine(current.modules, data), current.content_hash


def mirror_notes(
    session: Session, src: str, dst: str, port: int, decision: FlowDecision, *, proto: str = "tcp", now: datetime,
    viewer: str | None = None, kept: KeptFlowDecider | None = None,
) -> list[str]:
    """What the devices add to `decision` (explain's, on src -> dst), which stays the policy's answer: RoCEv2 the
    policy denies still passes as the mirror of dst -> src when the policy allows that (core/rocev2.py), so the
    reverse is asked (on `kept` when given, as explain). Only what `viewer` (a tenant; None: a platform principal)
    may learn of both sides (policy/disclosure.py): a reverse it could not see is no note, whatever it says."""
    if decision.allow or not is_rocev2(proto, port):
        return []
    from policy.disclosure import hidden_side
    from policy.rocev2 import mirror_note

    back, _ = explain(session, dst, src, port, proto=proto, now=now, kept=kept)
    if not back.allow:
        return []
    a, b = parse_identity(src), parse_identity(dst)
    if hidden_side(session, viewer, ((a["tenant"], a["group"]), (b["tenant"], b["group"]))) is not None:
        return []
    return [mirror_note(f"{a['tenant']}/{a['group']}", f"{b['tenant']}/{b['group']}", back.reasons)]


class KeptFlowDecider(Protocol):
    """An engine kept loaded with the active version and a data document it rebuilds only when the rows
    under it change (policy/grant_decider.py's RegoGrantDecider)."""

    def decide_flow(self, session: Session, now: datetime, flow: dict[str, Any]) -> tuple[FlowDecision, str | None]:
        """The decision on `flow` under the active version at `now`, and that version's hash."""
        ...


def explain(
    session: Session, src: str, dst: str, port: int, *, proto: str = "tcp", now: datetime,
    kept: KeptFlowDecider | None = None,
) -> tuple[FlowDecision, str | None]:
    """The decision on one flow under the active version, with the reasons; and that version's hash. On
    `kept` when given (milliseconds at 1,000 tenants), else on a fresh engine and document (the same answer)."""
    from pki.service import trust_domain

    request = flow_input(src, dst, port, proto, now_ns=to_ns(now), trust_domain=trust_domain(session))
    if kept is not None:
        return kept.decide_flow(session, now, request)
    engine, digest = engine_for_active(session, now)
    try:
        return decide_flow(engine, request), digest
    finally:
        engine.close()
