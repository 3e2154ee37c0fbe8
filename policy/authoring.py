"""Authoring a policy without a database: validate (what `opa check` catches), run the Rego unit tests,
prepare a version for upload, evaluate any query. `trustfabric policy validate|test|eval` (offline) import
this module alone; policy.service re-exports it for the API and the local commands."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policy.check import require_clean
from policy.testing import TestReport, run_tests
from policy.versions import check_modules, version_hash


def validate(modules: Mapping[str, str]) -> str:
    """Compile and statically check every module (policy.check: what `opa check` catches); the content
    hash, or PolicyCompileError listing every problem at file:line:col."""
    mods = check_modules(modules)
    require_clean(mods)
    return version_hash(mods)


def test(modules: Mapping[str, str], *, run: str | None = None, coverage: bool = False) -> TestReport:
    """Validate, then run every `test_*` rule (those `run` matches), with line coverage when asked."""
    mods = check_modules(modules)
    require_clean(mods)
    return run_tests(mods, run=run, coverage=coverage)


def evaluate_query(modules: Mapping[str, str], query: str, *, input: Any = None,
                   data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`opa eval`: the query's results as OPA's REST API and `opa eval` print them
    ({"result": [{"expressions": [...], "bindings": {...}}]}, no result when undefined);
    EmptyQuery when the query holds no expression, PolicyCompileError when a module does not compile,
    PolicyEngineError (file:line:col) when the query fails."""
    from policy.engines.embedded import new_engine
    from policy.errors import PolicyEngineError, parse_regorus_error, require_query

    require_query(query)  # EmptyQuery: said as such, not as the parser's "expecting ..."
    engine = new_engine(check_modules(modules) if modules else {})
    error: str | None = None
    out: dict[str, Any] = {}
    try:
        engine.add_data_json(json.dumps(dict(data or {})))
        engine.set_input_json(json.dumps(input if input is not None else {}))
        out = json.loads(engine.eval_query_as_json(query))
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        error = str(parse_regorus_error(str(exc), default_file="<query>"))
    finally:
        del engine
    if error is not None:
        raise PolicyEngineError(error)
    return {"result": out.get("result") or []}


@dataclass(frozen=True)
class PreparedVersion:
    """Modules compiled and tested, ready to store: prepare outside the write transaction (the Rego
    tests take a while and SQLite holds its writer lock for the whole transaction)."""

    modules: dict[str, str]
    content_hash: str
    report: TestReport


def prepare(modules: Mapping[str, str]) -> PreparedVersion:
    """Check, compile and statically check (PolicyCompileError with file:line:col), run the Rego tests."""
    mods = check_modules(modules)
    require_clean(mods)
    return PreparedVersion(mods, version_hash(mods), run_tests(mods))
