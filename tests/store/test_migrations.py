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

DIALECTS: dict[str, Dialect] = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}
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
}


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
    assert [s.version for s in STEPS] == [1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13]
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
    if backend == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        db = Database(server.create_database(migrated=False))
    else:
        db = Database(sqlite_url(tmp_path))
    try:
        assert current_version(db.engine) == 0
        assert migrate(db.engine) == [step.version for step in STEPS]
        assert migrate(db.engine) == []
        assert current_version(db.engine) == STEPS[-1].version
    finally:
        db.dispose()
