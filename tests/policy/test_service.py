"""Policy versions on the real databases: upload, tests, impact, activate, rollback, signatures, audit."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sqlmodel import col, func, select

from audit import Actor
from audit.models import AuditEvent
from core.errors import Conflict, InvalidInput, NotFound
from policy import service
from policy.decide import Flow
from policy.errors import PolicyCompileError, PolicyTestsFailed, SignatureRequired
from policy.models import PolicyVersion
from policy.versions import load_verify_key, version_hash
from store.db import Database
from tests.policy.dbutil import populate
from tests.policy.helpers import shipped

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SEC = Actor("alice", "security")


def _actions(db: Database) -> list[str]:
    with db.read_session() as s:
        return [e.action for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()]


def _count(db: Database) -> int:
    with db.read_session() as s:
        return int(s.exec(select(func.count()).select_from(PolicyVersion)).one())


def _no_platform(modules: dict[str, str]) -> dict[str, str]:
    """A variant whose platform-service rule can never match (the platform tenant is renamed); its
    flows tests, which expect the platform rule, are left out."""
    out = {k: v for k, v in modules.items() if k != "flows_test.rego"}
    out["flows.rego"] = out["flows.rego"].replace('platform_tenant := "platform"', 'platform_tenant := "nowhere"', 1)
    return out


def test_upload_stores_version_with_test_results_and_audits(db: Database) -> None:
    with db.session() as s:
        v, created = service.upload(s, shipped(), SEC, now=NOW, note="first")
    assert created and v.number == 1 and v.state == "candidate" and v.tests_passed
    assert v.content_hash == version_hash(shipped()) and len(v.tests) >= 50
    with db.session() as s:
        again, created = service.upload(s, dict(reversed(list(shipped().items()))), SEC, now=NOW)
    assert not created and again.number == 1  # same content, any order: same version
    assert _actions(db) == ["policy.upload"]


def test_broken_upload_stores_nothing(db: Database) -> None:
    broken = shipped()
    broken["flows.rego"] += "\nbroken := {\n"
    with pytest.raises(PolicyCompileError) as info, db.session() as s:
        service.upload(s, broken, SEC, now=NOW)
    assert info.value.issues[0].file == "flows.rego"
    assert _count(db) == 0 and _actions(db) == []
    for bad in ({}, {"../x.rego": "package x"}, {"x.txt": "package x"}):
        with pytest.raises(InvalidInput), db.session() as s:
            service.upload(s, bad, SEC, now=NOW)
    assert _count(db) == 0


def test_version_with_failing_tests_is_stored_but_cannot_be_activated(db: Database) -> None:
    mods = shipped()
    mods["flows.rego"] = mods["flows.rego"].replace('"intra-tenant: %s exposes', '"intra: %s exposes', 1)
    with db.session() as s:
        v, _ = service.upload(s, mods, SEC, now=NOW)
    assert not v.tests_passed
    with pytest.raises(PolicyTestsFailed) as info, db.session() as s:
        service.activate(s, v.number or 0, SEC, now=NOW)
    assert "flows_test.test_intra_tenant_exposed_port_allowed" in info.value.failing
    assert _actions(db) == ["policy.upload"]


def test_activate_rollback_lifecycle(db: Database) -> None:
    with db.session() as s:
        v1, _ = service.upload(s, shipped(), SEC, now=NOW)
        v2, _ = service.upload(s, {**shipped(), "extra.rego": "package extra\n\nx := 1\n"}, SEC, now=NOW)
    with db.session() as s:
        service.activate(s, "1", SEC, now=NOW)
    with db.session() as s:
        service.activate(s, v2.content_hash[:12], SEC, now=NOW, reason="add extra")
    with db.read_session() as s:
        assert [v.state for v in service.list_versions(s)] == ["retired", "active"]
    with pytest.raises(Conflict), db.session() as s:
        service.activate(s, 2, SEC, now=NOW)
    with pytest.raises(Conflict), db.session() as s:
        service.rollback(s, 2, SEC, now=NOW)  # not earlier
    with db.session() as s:
        back = service.rollback(s, 1, SEC, now=NOW, reason="extra broke things")
    assert back.number == 1
    with db.read_session() as s:
        assert service.active_version(s).number == 1  # type: ignore[union-attr]
        assert [v.state for v in service.list_versions(s)] == ["active", "retired"]
        events = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all()
    assert [e.action for e in events] == ["policy.upload", "policy.upload", "policy.activate", "policy.activate",
                                          "policy.rollback"]
    assert events[-1].summary["previous"] == [2] and events[-1].reason == "extra broke things"
    for ref in ("99", "deadbeefdeadbeef"):
        with pytest.raises(NotFound), db.read_session() as s:
            service.get_version(s, ref)
    with pytest.raises(InvalidInput), db.read_session() as s:
        service.get_version(s, "latest")
    _ = v1


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa"])
def test_signed_activation(db: Database, kind: str) -> None:
    edkey = ed25519.Ed25519PrivateKey.generate()
    eckey = ec.generate_private_key(ec.SECP256R1())

    def sign(m: bytes) -> bytes:
        return edkey.sign(m) if kind == "ed25519" else eckey.sign(m, ec.ECDSA(hashes.SHA256()))

    public = edkey.public_key() if kind == "ed25519" else eckey.public_key()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    keys = [load_verify_key(pem)]
    other = ed25519.Ed25519PrivateKey.generate()
    with db.session() as s:
        v, _ = service.upload(s, shipped(), SEC, now=NOW)
    good = base64.b64encode(sign(v.content_hash.encode())).decode()
    wrong = base64.b64encode(other.sign(v.content_hash.encode())).decode()
    for sig in (None, wrong, "%%%", base64.b64encode(sign(b"another hash")).decode()):
        with pytest.raises(SignatureRequired), db.session() as s:
            service.activate(s, 1, SEC, now=NOW, signature=sig, verify_keys=keys)
    assert _actions(db) == ["policy.upload"]
    with db.session() as s:
        done = service.activate(s, 1, SEC, now=NOW, signature=good, verify_keys=keys)
    assert done.state == "active" and done.signed_by and done.signature == good


def test_impact_report_is_exact_on_a_constructed_inventory(db: Database) -> None:
    with db.session() as s:
        populate(s, NOW)
        service.upload(s, _no_platform(shipped()), SEC, now=NOW)
        service.upload(s, shipped(), SEC, now=NOW)
    with db.read_session() as s:
        first = service.impact(s, 1, now=NOW)  # nothing active: everything it allows is opened
    assert first.baseline_hash is None and first.closed == []
    assert Flow("acme", "web", "acme", "db", "tcp", 5432) in first.opened
    with db.session() as s:
        service.activate(s, 1, SEC, now=NOW)
    with db.read_session() as s:
        report = service.impact(s, 2, now=NOW)
    # the candidate adds exactly the platform-service flows of every usable non-platform group
    assert report.opened == [
        Flow("acme", "db", "platform", "dns", "udp", 53),
        Flow("acme", "web", "platform", "dns", "udp", 53),
        Flow("globex", "api", "platform", "dns", "udp", 53),
    ]
    assert report.closed == []
    assert report.by_tenant == {"acme": {"opened": 2, "closed": 0}, "globex": {"opened": 1, "closed": 0},
                                "platform": {"opened": 3, "closed": 0}}
    with db.read_session() as s:
        reverse = service.impact(s, 1, now=NOW)
    assert reverse.opened == [] and reverse.closed == []  # version 1 against itself


def test_explain_uses_the_active_version(db: Database) -> None:
    with db.session() as s:
        ids = populate(s, NOW)
    with db.read_session() as s:
        d, digest = service.explain(s, "acme/web", "globex/api", 8443, now=NOW)
    assert not d.allow and d.reasons[0].startswith("no-policy:") and digest is None
    with db.session() as s:
        service.upload(s, shipped(), SEC, now=NOW)
        service.activate(s, 1, SEC, now=NOW)
    with db.read_session() as s:
        d, digest = service.explain(s, "acme/web", "globex/api", 8443, now=NOW)
        assert d.allow and d.reasons == ["grant:live allows acme/web -> globex/api on tcp/8443"]
        d, _ = service.explain(s, ids["revoked"], "acme/db", 5432, now=NOW)
        assert not d.allow and d.reasons[0].startswith("revoked-identity:")
        d, _ = service.explain(s, "acme/web", "acme/db", 22, now=NOW)
        assert d.reasons == ["port-not-exposed: acme/db does not expose tcp/22"]


def test_concurrent_activations_leave_exactly_one_version_active(db: Database) -> None:
    """B asks to activate v3 while A's activation of v2 is uncommitted: whatever B's fate (it waits and
    retires v2, or its stale write is refused), one version is active afterwards, never two."""
    import threading
    import time

    with db.session() as s:
        for extra in ("", "a", "b"):
            mods = {**shipped(), "extra.rego": f'package extra\n\nx := "{extra}"\n'} if extra else shipped()
            service.upload(s, mods, SEC, now=NOW)
        service.activate(s, 1, SEC, now=NOW)
    outcome: list[object] = []

    def activate_three() -> None:
        try:
            with db.session() as s:
                outcome.append(service.activate(s, 3, SEC, now=NOW).number)
        except Exception as exc:  # SQLite refuses the stale writer; that is fine here
            outcome.append(exc)

    with db.session() as s:
        service.activate(s, 2, SEC, now=NOW)
        other = threading.Thread(target=activate_three)
        other.start()
        time.sleep(0.5)  # B is now waiting for A's row locks (PostgreSQL) or A's write lock (SQLite)
    other.join(timeout=30)
    assert not other.is_alive() and outcome
    with db.read_session() as s:
        active = [v.number for v in service.list_versions(s) if v.state == "active"]
    assert len(active) == 1, (active, outcome)
    assert active == ([3] if outcome == [3] else [2])
