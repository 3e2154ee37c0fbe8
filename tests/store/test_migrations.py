"""Schema steps are owned by their domains, frozen, and agree with the models.

- The tables and indexes the steps create compile to exactly the DDL the models would create, on SQLite
  and PostgreSQL: a model that grows without a new step fails here (add a step, never edit a landed one).
- Each landed step's DDL is pinned by hash: editing a landed step fails here.
- store/ imports no domain: it only runs the steps it is handed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import Column, MetaData, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import SQLModel

import audit.models
import enforcer.models
import inventory.models
import keys.models
import pki.models
import pki.tokens.models
import policy.models
from store.db import Database, sqlite_url
from store.migrations import current_version
from tests.conftest import PostgresServer
from workflows.schema import STEPS, migrate

# SQLAlchemy's psycopg dialect has an unannotated __init__ (the sqlite one's is annotated)
DIALECTS: dict[str, Dialect] = {"sqlite": sqlite.dialect(),
                                "postgresql": postgresql.dialect()}  # type: ignore[no-untyped-call]
MODEL_MODULES = (audit.models, inventory.models, pki.models, policy.models, pki.tokens.models, enforcer.models,
                 keys.models)

# sha256 of each landed step's DDL (tables then indexes, in name order), per dialect. A landed step never
# changes: a schema change is a new step with the next version number.
LANDED = {
    1: {
        "sqlite": "d988ce73399e5b8b8db61834abffba11ddc67ada76cc269bbc77f3a55830e9fb",
        "postgresql": "17492c37046010b4f50f55a379d2e1316d1d51c08b2104acc2897812cde1e2d8",
    },
    2: {
        "sqlite": "d6d9bf0d52360cfed85439d1cf473646a5ce0c12c8ce4d9d59fa4cb657787df3",
        "postgresql": "7020e5ac9f9a53e7e835a7262ca3bddb771713b5c1c1ab62dfbb5600dd19845a",
    },
    3: {
        "sqlite": "a858665290b8fc373bdb2e1e913ff68b732596b49e5a4d1e663fcfcf033d7d4a",
        "postgresql": "554e52c80e499c2bb3466e9510e008d9c3caa01b3f4a340eb91fbdf6889efc7b",
    },
    4: {
        "sqlite": "c17789674727a420ccbbfe03efaa2e548a7cb81aeb7dfdb5075db3cd0bba793d",
        "postgresql": "052599c054018999ce7c185a5f6defd8cea49dd24a8327699065ddade75cdf10",
    },
    5: {
        "sqlite": "9a198c6eaf94fe173c4b26ce22e709bdfc08c3f6c1c24df3a51ea082536cb813",
        "postgresql": "25f58a335a99925b7eb3dfaf98d88b23868701155700dee6d6501f3610f1c498",
    },
    6: {
        "sqlite": "9d45ce42596df2289c8492490d35f240a7ca78c555103ce17d13ce6ad1e0bab8",
        "postgresql": "b9c069df7c94c46ccef211bd3cb221f1a07df8af8513dd3c82702454b6b8f93a",
    },
    9: {
        "sqlite": "1eb07daefafdf025c243ff74e56babb9b6a0c49c77caacbdf78e30072ff1eb58",
        "postgresql": "817795101834bcae1421fc9d349180ca01cd4aeb177fc30f712e1fc5a1429d1a",
    },
    10: {
        "sqlite": "41d055756be5281b870a4168f071a9013f0668826d277f2eb124323b1be0019f",
        "postgresql": "18c71dadf367023833ea91ef1a2438cbf2431101105aaa7cc656388f5db3f20a",
    },
    11: {
        "sqlite": "6f7c350ffe8ba05ff0a8fdf5004567eeb181a1166a4e9596696fce1b8969602f",
        "postgresql": "fb1fab0d5fb36c71a1f791de95e68694a2c6534c12e05b750b9c8131813f38d5",
    },
    12: {  # no table (a function)
        "sqlite": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "postgresql": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    },
    13: {
        "sqlite": "328a4ac8e7186f3342296768d883786a20d3d8532658af39b347744a23f9b6f4",
        "postgresql": "510e23dea4dd9b27d5ee4086b4ed0bbcac2ae33b004ed244d6a4b2a0f02c4ab8",
    },
    14: {  # grants as the step leaves them (PostgreSQL alters the table in place; SQLite rebuilds it)
        "sqlite": "fabdc8d9802649d76e38a173077632db90f0d745f2394d5a7f8ecd62de78f859",
        "postgresql": "290e471b104c02fc7bed79966fee93c0aa19e942bcecdfdb37c991dfc701eb95",
    },
    15: {
        "sqlite": "03682c3c1210a0e355700d7bc937913015d8f682a2e1f7a263b78d899bacd69e",
        "postgresql": "03682c3c1210a0e355700d7bc937913015d8f682a2e1f7a263b78d899bacd69e",
    },
    16: {
        "sqlite": "3175255621b0031bdbaa87f2021d087043322c929b570bc4ae2ba326a2bed4c3",
        "postgresql": "73dfd93fef9f62f10f2a500348eef07d2c250df948d779c82029c06bbde5c233",
    },
    17: {
        "sqlite": "54025c63135232c51ba0a305c30ad3670c75c17cf1d964f4bf5fb423f8e4ddb7",
        "postgresql": "0de286428fc5093ee8a76358f5f700ef9339d6e8eb13ebd8dfe4c0a0f47b18c7",
    },
    18: {  # a column: deployment.origin
        "sqlite": "41476a8e8ff759b4e2380448c1bc3bf74f9a410ba1fe0e1830da241116ca8851",
        "postgresql": "41476a8e8ff759b4e2380448c1bc3bf74f9a410ba1fe0e1830da241116ca8851",
    },
    19: {  # adopted_keys, and a column: deployment.adopted_at
        "sqlite": "45c4db9ad529cf6579be6104eb65b6eb79b0bbaf7d20b2bf86a17f1fe57148fc",
        "postgresql": "db849b1a89e797a5d128465c313b40042069f64a645890a3366c7b98a186e1b8",
    },
    20: {  # a column: enforcer_devices.report_seq
        "sqlite": "4e0814350f497f78367bff15555796ceabbf6c41b5e5b56be01e7d2c4e4504c5",
        "postgresql": "4e0814350f497f78367bff15555796ceabbf6c41b5e5b56be01e7d2c4e4504c5",
    },
}


def _empty_database(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a database no step has run on: a new one on the test session's PostgreSQL, or a SQLite file."""
    if backend == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        return server.create_database(migrated=False)
    return sqlite_url(tmp_path)


def _ddl(tables: list[Table], dialect: Dialect) -> list[str]:
    out = []
    for table in sorted(tables, key=lambda t: t.name):
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return out


def _step_module(version: int) -> object:
    step = next(s for s in STEPS if s.version == version)
    return __import__(step.apply.__module__, fromlist=["_"])


def _step_tables(version: int) -> list[Table]:
    meta: MetaData = getattr(_step_module(version), f"_v{version}")
    return list(meta.tables.values())


def _step_added_columns(version: int) -> dict[str, tuple[Column[object], ...]]:
    """Columns a step adds to tables an earlier step made (`_added_v<N>` in the step's module)."""
    added: dict[str, tuple[Column[object], ...]] = getattr(_step_module(version), f"_added_v{version}", {})
    return added


def _tables_after_every_step() -> list[Table]:
    """The schema the steps build, in order: each step's new tables, then the columns it adds."""
    tables: dict[str, Table] = {}
    for step in STEPS:
        tables.update((t.name, t) for t in _step_tables(step.version))
        for name, columns in _step_added_columns(step.version).items():
            grown = tables[name].to_metadata(MetaData())  # a copy: the landed step's table stays as it was
            for column in columns:
                grown.append_column(column._copy())
            tables[name] = grown
    return list(tables.values())


def _step_ddl(version: int, dialect: Dialect) -> str:
    lines = _ddl(_step_tables(version), dialect)
    for name, columns in sorted(_step_added_columns(version).items()):
        lines += [f"ALTER TABLE {name} ADD COLUMN {c.name} {c.type.compile(dialect=dialect)}" for c in columns]
    return "\n".join(lines)


def _model_tables() -> list[Table]:
    """Every table the model modules declare (importing them registers them in SQLModel's metadata)."""
    assert all(m.__name__.endswith("models") for m in MODEL_MODULES)
    return list(SQLModel.metadata.tables.values())


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_the_steps_create_exactly_the_models_schema(dialect: str) -> None:
    assert _ddl(_tables_after_every_step(), DIALECTS[dialect]) == _ddl(_model_tables(), DIALECTS[dialect])


@pytest.mark.parametrize("version", sorted(LANDED))
def test_a_landed_step_never_changes(version: int) -> None:
    for name, dialect in DIALECTS.items():
        digest = hashlib.sha256(_step_ddl(version, dialect).encode()).hexdigest()
        assert digest == LANDED[version][name], f"step {version} ({name}) changed: add a new step instead"


def test_versions_are_global_and_in_order() -> None:
    assert [s.version for s in STEPS] == [1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    with pytest.raises(ValueError, match="distinct, increasing"):
        from store.migrations import migrate as run

        run(Database("sqlite://").engine, [STEPS[1], STEPS[0]])


def test_migrating_a_real_database_applies_every_step_once(db: Database) -> None:
    assert current_version(db.engine) == STEPS[-1].version  # the fixture migrated it
    assert migrate(db.engine) == []



@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_an_empty_database_takes_every_step_once(backend: str, request: pytest.FixtureRequest,
                                                 tmp_path: Path) -> None:
    """The `db` fixture's databases are copies of one database migrated once per test process
    (tests/conftest.py): here the steps run on an empty database of each kind, as on a fresh install."""
    db = Database(_empty_database(backend, request, tmp_path))
    try:
        assert current_version(db.engine) == 0
        assert migrate(db.engine) == [step.version for step in STEPS]
        assert migrate(db.engine) == []
        assert current_version(db.engine) == STEPS[-1].version
    finally:
        db.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_replicas_starting_together_migrate_once_and_both_start(backend: str, request: pytest.FixtureRequest,
                                                               tmp_path: Path) -> None:
    """Replicas deployed together each migrate at start, on one empty database: they take turns, every step is
    applied once by one of them, and neither fails (before, the second one's CREATE TABLE or ADD COLUMN met the
    first's and its replica exited until restarted)."""
    import threading

    url = _empty_database(backend, request, tmp_path)
    replicas = [Database(url) for _ in range(3)]
    start = threading.Barrier(len(replicas))
    applied: list[list[int]] = []
    failures: list[BaseException] = []

    def run(db: Database) -> None:
        start.wait()
        try:
            applied.append(migrate(db.engine))
        except BaseException as exc:  # reported below, with the replica's error
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(db,)) for db in replicas]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert failures == []
        assert sorted(v for versions in applied for v in versions) == [step.version for step in STEPS]
        assert current_version(replicas[0].engine) == STEPS[-1].version
    finally:
        for db in replicas:
            db.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_step_14_scopes_existing_idempotency_keys_by_the_requesters_tenant(backend: str, request: pytest.FixtureRequest,
                                                                           tmp_path: Path) -> None:
    """A database at step 13 holding keyed grants of acme's `alice` and the platform's `alice` (one id): after step
    14 each retry still finds its own grant, globex's `alice` can use the same key, the old UNIQUE(requested_by,
    idempotency_key) is gone for the scoped one (no default: a write must say whose key it is), and the grants
    table still bumps the policy data version (SQLite rebuilt it: its triggers are made again as they were)."""
    from datetime import UTC, datetime

    from sqlalchemy import inspect, text

    from audit import Actor
    from audit.actor import ActorKind
    from policy.grants import Caller, GrantDecision, GrantRequest, PreparedGrant, commit_request, prepare_request
    from policy.migrations import _TABLES_V1
    from policy.models import Grant
    from store.migrations import migrate as run
    from tests.audit.oldform import append_old

    db = Database(_empty_database(backend, request, tmp_path))
    now = datetime(2026, 12, 1, 9, tzinfo=UTC)

    def triggers() -> list[tuple[str, ...]]:
        query = ("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'grants' ORDER BY name"
                 if backend == "sqlite" else
                 "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'grants'::regclass "
                 "AND NOT tgisinternal ORDER BY tgname")
        with db.engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(query)]

    def data_version() -> int:
        with db.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT n FROM policy_data_version WHERE id = 1").scalar_one())

    try:
        assert run(db.engine, [s for s in STEPS if s.version < 14])[-1] == 13
        before = triggers()
        assert [t[0] for t in before] == ["tf_pdv_grants_delete", "tf_pdv_grants_insert", "tf_pdv_grants_update"]
        old_grants = _TABLES_V1[0]
        rows: list[tuple[str, str, ActorKind | None, str, str]] = [  # (id, requester, the actor kind of its
            # grant.request event or None, key, source tenant)
            ("g-acme-alice", "alice", "tenant", "k-1", "acme"),
            ("g-platform-alice", "alice", "admin", "k-2", "globex"),
            ("g-workload", "spiffe://td/tenant/globex/group/api/w", "workload", "k-1", "globex"),
            ("g-no-event", "bob", None, "k-1", "acme"),  # a hand-made row: no grant.request event
        ]
        with db.session() as s:
            for gid, by, kind, key, src in rows:
                s.execute(old_grants.insert().values(
                    id=gid, src_tenant=src, src_group="web", dst_tenant="initech", dst_group="api", proto="tcp",
                    ports=[443], justification="", ttl_seconds=3600, state="active", requested_by=by,
                    idempotency_key=key, required_approvers=[], approvals=[], reasons=[], created_at=now,
                    expires_at=datetime(2027, 1, 1, tzinfo=UTC), version=1))
                if kind is not None:  # as the code of step 13's time wrote it (record() now writes step 15's)
                    append_old(s.connection(), actor_id=by, actor_kind=kind, action="grant.request",
                               object_type="grant", object_id=gid, tenant=src, at=now)

        assert migrate(db.engine) == [14, 15, 16, 17, 18, 19, 20]
        with db.read_session() as s:
            scoped = dict(s.execute(text("SELECT id, requester_tenant FROM grants")).all())
        assert scoped == {"g-acme-alice": "acme", "g-platform-alice": "", "g-workload": "globex", "g-no-event": ""}
        assert triggers() == before
        uniques = inspect(db.engine).get_unique_constraints("grants")
        assert [u["column_names"] for u in uniques] == [["requester_tenant", "requested_by", "idempotency_key"]]
        column = next(c for c in inspect(db.engine).get_columns("grants") if c["name"] == "requester_tenant")
        assert column["nullable"] is False and column["default"] is None

        def approve(_s: object, _now: datetime, _input: object) -> GrantDecision:
            return GrantDecision("approve", [], ["auto-approved"])

        def ask(caller: Caller, src: str, key: str) -> Grant | PreparedGrant:
            req = GrantRequest(src, "web", "initech", "api", "tcp", [443], 3600)
            with db.read_session(statements=True) as s:
                return prepare_request(s, req, caller=caller, decide=approve, idempotency_key=key, clock=lambda: now)

        acme = Caller("alice", "tenant-admin", "acme", Actor("alice", "tenant", "acme"))
        globex = Caller("alice", "tenant-admin", "globex", Actor("alice", "tenant", "globex"))
        platform = Caller("alice", "admin", None, Actor("alice", "admin"))
        retried = ask(acme, "acme", "k-1")
        assert isinstance(retried, Grant) and retried.id == "g-acme-alice"
        retried = ask(platform, "globex", "k-2")
        assert isinstance(retried, Grant) and retried.id == "g-platform-alice"
        assert isinstance(ask(acme, "acme", "k-2"), PreparedGrant)  # the platform's alice's key is not acme's
        theirs = ask(globex, "globex", "k-1")
        assert isinstance(theirs, PreparedGrant)  # acme's alice's key is not globex's
        n = data_version()
        with db.session() as s:
            commit_request(s, theirs, caller=globex, recheck=False)
        assert data_version() == n + 1  # an active grant inserted: the trigger made again still bumps
        retried = ask(globex, "globex", "k-1")
        assert isinstance(retried, Grant) and retried.id == theirs.grant.id
    finally:
        db.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize(("history", "origin"), [
    (("ca.init", "deployment.create"), "upgrade"),  # a trust domain from before markers, then its deployment id
    (("deployment.create", "ca.init"), "init"),  # init made the id first: its keys were marked from birth
    (("deployment.create",), "init"),  # an init that has not made its trust domain yet
    ((), None),  # no deployment row yet (a database from before step 16, or before its first init): nothing to set
    (("ca.init",), None),  # its row comes at its next start (origin `upgrade`: workflows/init.py)
    # several deployment.create events (a row removed by hand and written again): the first one decides
    (("deployment.create", "ca.init", "deployment.create"), "init"),
    (("ca.init", "deployment.create", "deployment.create"), "upgrade"),
])
def test_step_18_tells_a_deployment_whose_keys_predate_markers_from_one_born_with_them(
        backend: str, history: tuple[str, ...], origin: str | None, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    """A database at step 17 holds a deployment row the code of that time wrote, which does not say whether its keys
    predate markers. The audit log does: step 18 records `upgrade` only when the trust domain was made before the
    deployment id; such a deployment alone may use unmarked keys (keys/deployment.py)."""
    from datetime import UTC, datetime

    from audit import Actor, record
    from store.migrations import migrate as run

    db = Database(_empty_database(backend, request, tmp_path))
    now = datetime(2026, 12, 1, 9, tzinfo=UTC)
    try:
        assert run(db.engine, [s for s in STEPS if s.version < 18])[-1] == 17
        seen: list[str] = []
        with db.session() as s:
            for action in history:
                if action == "deployment.create" and "deployment.create" not in seen:
                    s.connection().exec_driver_sql(
                        "INSERT INTO deployment (id, deployment_id, created_at) VALUES (1, %s, %s)"
                        if backend == "postgres" else
                        "INSERT INTO deployment (id, deployment_id, created_at) VALUES (1, ?, ?)", ("d" * 32, now))
                record(s, actor=Actor.system("init"), action=action, object_type="x", object_id="d" * 32, at=now)
                seen.append(action)
        assert run(db.engine, [s for s in STEPS if s.version < 19]) == [18]
        with db.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT origin FROM deployment").scalars().all()
        assert rows == ([] if origin is None else [origin])
        assert migrate(db.engine) == [19, 20]  # 19 adopts nothing: the token is out of a migration's reach
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT adopted_at FROM deployment").scalars().all() == [None] * len(rows)
            assert conn.exec_driver_sql("SELECT count(*) FROM adopted_keys").scalar_one() == 0
        assert migrate(db.engine) == []  # applied once: a replica migrating after it finds it done
    finally:
        db.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_step_20_numbers_status_reports_from_the_next_numbered_one(backend: str, request: pytest.FixtureRequest,
                                                                   tmp_path: Path) -> None:
    """A database at step 19 holds a device whose status an agent of that time reported (not numbered): step 20
    keeps it as it was with no number (NULL, never a made-up one); an unnumbered report is still stored as it
    comes, the first numbered one is stored, and one numbered below it afterwards changes nothing."""
    from datetime import UTC, datetime

    from audit import Actor
    from enforcer import service
    from enforcer.migrations import _TABLES_V11
    from store.migrations import migrate as run

    db = Database(_empty_database(backend, request, tmp_path))
    now = datetime(2026, 12, 1, 9, tzinfo=UTC)
    devices = next(t for t in _TABLES_V11 if t.name == "enforcer_devices")
    node = Actor("spiffe://td/node/gpu1", "node")
    try:
        assert run(db.engine, [s for s in STEPS if s.version < 20])[-1] == 19
        with db.session() as s:  # as the code of step 19's time wrote it
            s.execute(devices.insert().values(
                device="nic:gpu1", kind="nic", in_fabric=True, version=0, pinned=False, drift=["x"],
                drift_repaired=True, last_error="old", counters={"k": {"packets": 1, "bytes": 2}}, reported_at=now,
                updated_at=now))
        assert migrate(db.engine) == [20]
        with db.read_session() as s:
            row = service.status_row(s, "nic:gpu1")
        assert row["report_seq"] is None and row["drift"] == ["x"] and row["last_error"] == "old"
        with db.session() as s:  # an agent from before numbering
            assert not service.record_status(s, "nic:gpu1", {"last_error": "unnumbered"}, actor=node, now=now).stale
        with db.session() as s:
            assert not service.record_status(s, "nic:gpu1", {"last_error": "new", "report_seq": 7}, actor=node,
                                             now=now).stale
        with db.session() as s:
            assert service.record_status(s, "nic:gpu1", {"last_error": "late", "report_seq": 6}, actor=node,
                                         now=now).stale
        with db.read_session() as s:
            row = service.status_row(s, "nic:gpu1")
        assert (row["report_seq"], row["last_error"]) == (7, "new")
        assert migrate(db.engine) == []
    finally:
        db.dispose()
