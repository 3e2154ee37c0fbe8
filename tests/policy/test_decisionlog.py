"""Sampled decision records: written with input, result, reasons and policy hash; queryable."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from core.clock import FrozenClock
from core.errors import InvalidInput
from policy.decide import AuthzDecision, FlowDecision, GrantDecision, decide_flow
from policy.decisionlog import DecisionLog, query_decisions
from policy.engines.embedded import RegorusEngine
from policy.versions import version_hash
from store.db import Database
from tests.policy.helpers import flow, shipped, small_doc

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_records_are_written_and_queryable(db: Database) -> None:
    clock = FrozenClock(T0)
    log = DecisionLog(db, sample_rate=1.0, clock=clock)
    engine = RegorusEngine(shipped(), small_doc())
    digest = version_hash(shipped())
    for args in [("acme", "web", "acme", "batch", "tcp", 8080), ("globex", "api", "acme", "web", "tcp", 443)]:
        i = flow(*args)
        assert log.record("flow", i, decide_flow(engine, i), digest, owner=args[0])
        clock.advance(timedelta(seconds=10))
    log.record("grant", {"requester": {"tenant": "acme"}}, GrantDecision("pending", ["tenant-admin:b"], ["x"]), digest,
               owner="acme")
    log.record("authz", {"principal": {"tenant": "globex"}}, AuthzDecision(False, ["nope"]), None, owner="globex")
    with db.read_session() as s:
        everything = query_decisions(s)
        denied_flows = query_decisions(s, kind="flow", allowed=False)
        acme = query_decisions(s, tenant="acme")
        late = query_decisions(s, since=T0 + timedelta(seconds=5))
        by_hash = query_decisions(s, policy_hash=digest)
    assert [r.kind for r in everything] == ["authz", "grant", "flow", "flow"]
    [denied] = denied_flows
    assert denied.input["src"]["tenant"] == "globex" and denied.reasons[0].startswith("no-grant:")
    assert denied.result == {"allow": False, "reasons": denied.reasons} and denied.policy_hash == digest
    assert [r.kind for r in acme] == ["grant", "flow"]
    assert len(late) == 3 and len(by_hash) == 3
    assert everything[1].outcome == "pending" and everything[1].allowed


def test_sampling_keeps_every_deny_and_a_fraction_of_allows(db: Database) -> None:
    log = DecisionLog(db, sample_rate=0.1, rng=random.Random(3))
    allows = sum(log.record("flow", {}, FlowDecision(True, ["ok"]), None, owner=None) for _ in range(400))
    denies = sum(log.record("flow", {}, FlowDecision(False, ["no"]), None, owner=None) for _ in range(20))
    assert 10 < allows < 80 and denies == 20
    with db.read_session() as s:
        assert len(query_decisions(s, limit=1000)) == allows + denies
    none = DecisionLog(db, sample_rate=0.0, always_log_denies=False)
    assert not none.record("flow", {}, FlowDecision(False, ["no"]), None, owner=None)


def test_bad_arguments_are_rejected(db: Database) -> None:
    with pytest.raises(InvalidInput):
        DecisionLog(db, sample_rate=1.5)
    with pytest.raises(InvalidInput):
        DecisionLog(db).record("nonsense", {}, FlowDecision(True), None, owner=None)
    with pytest.raises(InvalidInput), db.read_session() as s:
        query_decisions(s, limit=0)


def test_a_grant_decision_is_logged_as_its_dataclass_fields() -> None:
    """GrantDecision.to_dict (every grant request's record is built from it) is dataclasses.asdict without the
    deep copy: the same keys and values, lists copied; a field added to the class and not to it fails here."""
    from dataclasses import asdict

    for decision in (GrantDecision("approve"), GrantDecision("pending", ["tenant-admin:globex", "security"], ["x"]),
                     GrantDecision("deny", [], ["no-policy: none", "quota"])):
        logged = decision.to_dict()
        assert logged == asdict(decision)
        assert logged["approvers"] is not decision.approvers and logged["reasons"] is not decision.reasons
