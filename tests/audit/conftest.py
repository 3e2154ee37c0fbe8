"""Audit test helpers: a real Ed25519 key behind the signer protocol, and a log filler."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit import Actor, record
from audit.models import AuditEvent
from store.db import Database

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TENANTS = ("acme", "globex", "initech")
ACTIONS = ("svid.issue", "grant.approve", "policy.activate", "flow.allow", "flow.deny", "tenant.create")


class KeySigner:
    """A software Ed25519 key with the KeyStore Signer's sign/public_key shape."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self._key = key or Ed25519PrivateKey.generate()

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()


@pytest.fixture
def signer() -> KeySigner:
    return KeySigner()


def fill(db: Database, count: int, *, start: int = 0, per_tx: int = 50) -> list[AuditEvent]:
    """Append `count` varied events (tenants, actions, summaries), one second apart."""
    out: list[AuditEvent] = []
    i = start
    while i < start + count:
        with db.session() as s:
            for _ in range(min(per_tx, start + count - i)):
                tenant = TENANTS[i % 3] if i % 5 else None
                summary: dict[str, Any] = {"n": i, "after": f"{i:064x}"}
                if ACTIONS[i % len(ACTIONS)].startswith("flow."):
                    summary = {"src": "spiffe://td/tenant/acme/group/a/w", "dst": "spiffe://td/tenant/globex/group/b/w"}
                out.append(
                    record(
                        s,
                        actor=Actor(f"user-{i % 7}", "admin") if i % 2 else Actor(f"user-{i % 7}", "tenant",
                                                                                   TENANTS[(i // 2) % 3]),
                        action=ACTIONS[i % len(ACTIONS)],
                        object_type="thing",
                        object_id=f"obj-{i}",
                        tenant=tenant,
                        summary=summary,
                        reason="because" if i % 4 == 0 else None,
                        request_id=f"req-{i}" if i % 3 == 0 else None,
                        at=T0 + timedelta(seconds=i),
                    )
                )
                i += 1
    return out


@pytest.fixture
def filled_sqlite(sqlite_db: Database) -> Iterator[Database]:
    fill(sqlite_db, 100)
    yield sqlite_db
