"""API test harness: a real data directory, real database (SQLite file, or the session's PostgreSQL),
real file key store and trust domain, the real app, and principals with real tokens of every role."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from audit import Actor
from audit.checkpoint import ensure_audit_key
from core.clock import FrozenClock
from inventory import service as inv
from keys.store import KeyKind
from pki.service import init_trust_domain
from pki.tokens.service import create_opaque_token, ensure_issuer_key, mint_token
from tests.conftest import TD as TD  # (re-exported: the API tests import them from here)
from tests.conftest import make_settings as make_settings
from tests.conftest import open_context as open_context
from workflows.context import AppContext
from workflows.settings import Settings


class Client(TestClient):
    """A TestClient that runs the app on one event loop for its whole life, as a server does. A plain TestClient
    starts an event loop for every request (and anyio a worker thread for each, for FastAPI's own hand-offs). Like a
    plain one it runs no lifespan unless entered (`with client:`). close() ends the loop and the app's worker
    threads; the session closes any left open (tests/conftest.py), since the loop's thread would hold the
    interpreter's exit."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._loop = ExitStack()
        self._own_portal: Any = self._loop.enter_context(start_blocking_portal(**self.async_backend))
        self.portal = self._own_portal
        OPEN_CLIENTS.add(self)

    def __exit__(self, *args: Any) -> None:
        try:
            super().__exit__(*args)
        finally:
            self.portal = self._own_portal  # the lifespan's loop is gone; requests go back to this client's

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.portal = self._own_portal = None
            self._loop.close()
            OPEN_CLIENTS.discard(self)
            # the app's kept threads (api/workers.py) end too
            workers = getattr(getattr(self.app, "state", None), "workers", None)
            if workers is not None:
                workers.close()


OPEN_CLIENTS: set[Client] = set()


def close_open_clients() -> None:
    for client in list(OPEN_CLIENTS):
        client.close()


class MovableClock(FrozenClock):
    """A frozen clock that starts at the real now (tokens and certificates stay plausible)."""


@dataclass
class Env:
    ctx: AppContext
    app: FastAPI
    client: TestClient
    clock: MovableClock
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, role: str, tenant: str | None = None, ttl: timedelta = timedelta(hours=1),
              subject: str | None = None) -> str:
        with self.ctx.db.session() as session:
            token, _row = mint_token(
                session, self.ctx.keystore, role=role, tenant=tenant, ttl=ttl, actor=Actor.system("test"),
                issuer=self.ctx.settings.api_issuer, audience=self.ctx.settings.api_audience,
                max_ttl=self.ctx.settings.max_token_ttl, subject=subject, clock=self.clock,
            )
        return token

    def headers(self, role: str, tenant: str | None = None) -> dict[str, str]:
        key = f"{role}:{tenant}"
        if key not in self.tokens:
            self.tokens[key] = self.token(role, tenant, ttl=timedelta(days=29))
        return {"Authorization": f"Bearer {self.tokens[key]}"}

    def call(self, method: str, path: str, role: str, tenant: str | None = None, **kw: Any) -> Any:
        headers = {**self.headers(role, tenant), **kw.pop("headers", {})}
        return self.client.request(method, path, headers=headers, **kw)


def open_env(settings: Settings, *, background: bool = False, td: str = TD) -> Env:
    clock = MovableClock(datetime.now(UTC).replace(microsecond=0))
    ctx = open_context(settings, clock)
    with ctx.db.session() as session:
        init_trust_domain(session, ctx.keystore, trust_domain=td, key_kind=KeyKind.EC_P256, clock=clock)
    ensure_issuer_key(ctx.keystore)
    ensure_audit_key(ctx.keystore)
    app = create_app(ctx, background=background)
    return Env(ctx=ctx, app=app, client=Client(app, raise_server_exceptions=False), clock=clock)


def seed(env: Env, td: str = TD, *, policy: bool = True) -> None:
    """Two tenants with groups: acme/web (tcp 443), acme/db; globex/api (tcp 443, 8443), globex/vault
    (sensitive, tcp 8200); a workload in each tenant; and (`policy`) the shipped rego/ as the active
    policy version, as `trustfabric init` leaves it."""
    with env.ctx.db.session() as s:
        actor = Actor.system("seed")
        for slug, vni, prefix in (("acme", 1001, "10.1.0.0/16"), ("globex", 1002, "10.2.0.0/16")):
            inv.create_tenant(s, slug=slug, display_name=slug.title(), l3vni=vni, prefix=prefix, actor=actor,
                              clock=env.clock)
        inv.create_group(s, tenant="acme", name="web", ports=[{"proto": "tcp", "port": 443}], actor=actor,
                         clock=env.clock)
        inv.create_group(s, tenant="acme", name="db", ports=[{"proto": "tcp", "port": 5432}], actor=actor,
                         clock=env.clock)
        inv.create_group(s, tenant="globex", name="api",
                         ports=[{"proto": "tcp", "port": 443}, {"proto": "tcp", "port": 8443}], actor=actor,
                         clock=env.clock)
        inv.create_group(s, tenant="globex", name="vault", ports=[{"proto": "tcp", "port": 8200}],
                         sensitivity="sensitive", actor=actor, clock=env.clock)
        inv.create_group(s, tenant="globex", name="public", ports=[{"proto": "tcp", "port": 80}],
                         labels={"grants.trustfabric.io/auto-approve": "true"}, actor=actor, clock=env.clock)
        inv.register_workload(s, trust_domain=td, tenant="acme", group="web", name="web-1", actor=actor,
                              clock=env.clock)
        inv.register_workload(s, trust_domain=td, tenant="globex", group="api", name="api-1", actor=actor,
                              clock=env.clock)
    if policy:
        activate_shipped_policy(env)


def activate_shipped_policy(env: Env) -> int:
    """What `trustfabric init` does: the shipped rego/ uploaded and activated as the policy in force."""
    from policy import service as policy_service
    from tests.policy.helpers import prepared_shipped

    actor = Actor.system("seed")
    with env.ctx.db.session() as s:
        version, _ = policy_service.upload(s, prepared_shipped(), actor, now=env.clock())
        if version.state != "active":
            policy_service.activate(s, version.number or 0, actor, now=env.clock())
        return version.number or 0


@contextmanager
def seeded_env(home: Path, database_url: str | None = None, **overrides: Any) -> Iterator[Env]:
    """An environment with seed()'s tenants and the shipped policy (settings `overrides`), closed when the
    block ends."""
    e = open_env(make_settings(home, database_url, **overrides))
    try:
        seed(e)
        yield e
    finally:
        e.client.close()
        e.ctx.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with seeded_env(tmp_path / "home") as e:
        yield e


BOTH_DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_for(request: pytest.FixtureRequest) -> str | None:
    """The database URL a fixture parametrised over BOTH_DATABASES runs on (None: SQLite in the home)."""
    return request.getfixturevalue("postgres_server").create_database() if request.param == "postgres" else None


@pytest.fixture(params=BOTH_DATABASES)
def env_both(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """The same environment on both real databases."""
    with seeded_env(tmp_path / "home", database_for(request)) as e:
        yield e


def admin_opaque(env: Env) -> str:
    with env.ctx.db.session() as session:
        return create_opaque_token(session, role="admin", subject="admin", actor=Actor.system("test"))
