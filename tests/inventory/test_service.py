"""Inventory changes on both real databases: validated, audited, nothing written on bad input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import col, select

from audit import Actor
from audit.models import AuditEvent
from core.errors import Conflict, InvalidInput, NotFound
from core.slugs import is_slug
from inventory import service
from inventory.models import Tenant, Workload
from store.db import Database

ADMIN = Actor(id="admin", kind="admin")


def _events(db: Database) -> list[str]:
    with db.read_session() as s:
        return [e.action for e in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))]


def test_register_derives_spiffe_id_and_audits_each_change(db: Database) -> None:
    with db.session() as s:
        service.create_tenant(s, slug="acme", display_name="Acme", actor=ADMIN, l3vni=10001, prefix="10.1.0.0/16")
        service.create_group(
            s, tenant="acme", name="train", actor=ADMIN, ports=[{"proto": "tcp", "port": 443}] * 2
        )
        w = service.register_workload(
            s, trust_domain="example.org", tenant="acme", group="train", name="w1", actor=ADMIN
        )
    assert w.spiffe_id == "spiffe://example.org/tenant/acme/group/train/w1"
    with db.read_session() as s:
        group = service.get_group(s, "acme", "train")
    assert group.ports == [{"proto": "tcp", "port": 443}]
    assert _events(db) == ["tenant.create", "group.create", "workload.register"]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"slug": "Acme"}, InvalidInput),
        ({"slug": "-acme"}, InvalidInput),
        ({"l3vni": 0}, InvalidInput),
        ({"l3vni": 2**24}, InvalidInput),
        ({"prefix": "10.1.0.1/16"}, InvalidInput),
        ({"display_name": ""}, InvalidInput),
    ],
)
def test_bad_tenant_input_is_rejected_and_nothing_written(db: Database, kwargs: dict[str, Any],
                                                          error: type[Exception]) -> None:
    args = {"slug": "acme", "display_name": "Acme", "l3vni": 1, "prefix": "10.1.0.0/16", **kwargs}
    with pytest.raises(error), db.session() as s:
        service.create_tenant(s, actor=ADMIN, **args)
    with db.read_session() as s:
        assert s.exec(select(Tenant)).all() == []
    assert _events(db) == []


def test_duplicates_and_unknown_parents(db: Database) -> None:
    with db.session() as s:
        service.create_tenant(s, slug="acme", display_name="Acme", actor=ADMIN, l3vni=7)
    with pytest.raises(Conflict), db.session() as s:
        service.create_tenant(s, slug="acme", display_name="again", actor=ADMIN)
    with pytest.raises(Conflict, match="l3vni 7"), db.session() as s:
        service.create_tenant(s, slug="other", display_name="Other", actor=ADMIN, l3vni=7)
    with pytest.raises(NotFound), db.session() as s:
        service.register_workload(s, trust_domain="td", tenant="acme", group="nope", name="w", actor=ADMIN)
    with db.read_session() as s:
        assert s.exec(select(Workload)).all() == []
    assert _events(db) == ["tenant.create"]


@pytest.mark.parametrize(
    "ports",
    [[{"proto": "icmp", "port": 1}], [{"proto": "tcp", "port": 0}], [{"proto": "tcp", "port": "*"}],
     [{"proto": "tcp", "port": True}], [{"proto": "tcp", "port": 70000}]],
)
def test_bad_ports_rejected(ports: list[dict[str, Any]]) -> None:
    with pytest.raises(InvalidInput):
        service.normalize_ports(ports)


def test_quarantine_needs_reason_and_records_before_after(db: Database) -> None:
    with db.session() as s:
        service.create_tenant(s, slug="acme", display_name="Acme", actor=ADMIN)
    with pytest.raises(InvalidInput), db.session() as s:
        service.set_quarantine(s, tenant="acme", group=None, quarantined=True, actor=ADMIN, reason=" ")
    with db.session() as s:
        service.set_quarantine(s, tenant="acme", group=None, quarantined=True, actor=ADMIN, reason="incident 7")
    with db.read_session() as s:
        assert service.get_tenant(s, "acme").quarantined is True
        ev = s.exec(select(AuditEvent).where(AuditEvent.action == "tenant.quarantine")).one()
    assert ev.summary == {"before": {"quarantined": False}, "after": {"quarantined": True}}
    assert ev.reason == "incident 7"
    # asking again changes nothing, so it is refused and writes no second event
    with pytest.raises(Conflict, match="already quarantined"), db.session() as s:
        service.set_quarantine(s, tenant="acme", group=None, quarantined=True, actor=ADMIN, reason="again")
    assert _events(db).count("tenant.quarantine") == 1


@given(st.text(max_size=70))
def test_slug_rule_matches_dns_label(value: str) -> None:
    import re

    expected = bool(re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", value)) and "\n" not in value
    assert is_slug(value) == expected
