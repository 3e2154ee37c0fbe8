"""Our Rego unit-test runner: every `test_*` rule of every loaded module, run through regorus.

A test passes when its rule evaluates to true; false, undefined or an evaluation error fail it
(the error carries file:line:col). Each result has its name (`<package>.<rule>`) and its time. Like
`opa test`: `run` (a regular expression searched in the names) picks the tests, and `coverage` reports
per module which lines the tests evaluated (regorus's coverage report; test modules are left out).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from core.errors import InvalidInput
from policy.engines.embedded import new_engine
from policy.errors import parse_regorus_error

_PACKAGE_RE = re.compile(r"^\s*package\s+([A-Za-z_][\w.]*)", re.MULTILINE)
_TEST_RE = re.compile(r"^(test_\w+)\b", re.MULTILINE)


@dataclass(frozen=True)
class RegoTest:
    package: str
    rule: str
    file: str
    line: int

    @property
    def name(self) -> str:
        return f"{self.package}.{self.rule}"


@dataclass(frozen=True)
class TestResult:
    name: str
    file: str
    line: int
    passed: bool
    duration_ms: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FileCoverage:
    file: str
    covered: list[int]
    not_covered: list[int]

    @property
    def percent(self) -> float:
        total = len(self.covered) + len(self.not_covered)
        return 100.0 if total == 0 else round(100.0 * len(self.covered) / total, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "percent": self.percent, "covered": self.covered, "not_covered": self.not_covered}


@dataclass(frozen=True)
class TestReport:
    results: list[TestResult] = field(default_factory=list)
    coverage: list[FileCoverage] | None = None

    @property
    def coverage_percent(self) -> float | None:
        """Lines evaluated over lines that could be, across every covered module."""
        if self.coverage is None:
            return None
        covered = sum(len(c.covered) for c in self.coverage)
        total = covered + sum(len(c.not_covered) for c in self.coverage)
        return 100.0 if total == 0 else round(100.0 * covered / total, 1)

    @property
    def summary(self) -> str:
        """`PASS: 61/61` or `FAIL: 1/61` (failed / total), as `opa test` counts."""
        total = len(self.results)
        failed = len(self.failing)
        return f"FAIL: {failed}/{total}" if failed else f"PASS: {total}/{total}"

    @property
    def passed(self) -> bool:
        """Every test passed, and there was at least one: a version with no tests has shown nothing."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failing(self) -> list[str]:
        return [r.name for r in self.results if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "passed": self.passed,
            "total": len(self.results),
            "failed": len(self.failing),
            "failing": self.failing,
            "results": [r.to_dict() for r in self.results],
        }
        if self.coverage is not None:
            out["coverage"] = {"percent": self.coverage_percent, "files": [c.to_dict() for c in self.coverage]}
        return out


def _ref_name(node: Any) -> str | None:
    """'a.b.c' from a regorus AST reference (Var / RefDot chain)."""
    if not isinstance(node, dict):
        return None
    if "Var" in node:
        return str(node["Var"]["value"])
    if "RefDot" in node:
        base = _ref_name(node["RefDot"]["refr"])
        fld = node["RefDot"]["field"]
        return f"{base}.{fld[1]}" if base is not None else None
    return None


def discover(modules: Mapping[str, str]) -> list[RegoTest]:
    """Every `test_*` rule, in file order; from regorus's AST, with a text scan as the fallback."""
    engine = new_engine(modules)
    found: list[RegoTest] = []
    seen: set[str] = set()
    try:
        asts = json.loads(engine.get_ast_as_json())
    except Exception:
        asts = []
    for item in asts:
        path = str(item.get("source", {}).get("file", ""))
        ast = item.get("ast", {})
        package = _ref_name(ast.get("package", {}).get("refr"))
        if package is None or package.startswith("data."):
            package = (package or "").removeprefix("data.")
        for rule in ast.get("rules", []):
            spec = rule.get("Spec") if isinstance(rule, dict) else None
            if not spec:
                continue
            head = spec.get("head", {})
            for kind in head.values():
                name = _ref_name(kind.get("refr")) if isinstance(kind, dict) else None
                if name and name.startswith("test_"):
                    test = RegoTest(package, name, path, int(kind["span"]["line"]))
                    if test.name not in seen:
                        seen.add(test.name)
                        found.append(test)
    if not asts:  # AST unavailable: scan the text
        for path in sorted(modules):
            text = modules[path]
            pkg = _PACKAGE_RE.search(text)
            if not pkg:
                continue
            for m in _TEST_RE.finditer(text):
                test = RegoTest(pkg.group(1), m.group(1), path, text[: m.start()].count("\n") + 1)
                if test.name not in seen:
                    seen.add(test.name)
                    found.append(test)
    return found


def is_test_module(path: str) -> bool:
    return path.endswith("_test.rego")


def run_tests(modules: Mapping[str, str], data: Mapping[str, Any] | None = None, *, run: str | None = None,
              coverage: bool = False) -> TestReport:
    """Run every test rule (those whose name `run` matches, when given); PolicyCompileError if a module does
    not parse (nothing is run then); InvalidInput for a `run` that is no regular expression."""
    tests = discover(modules)
    if run is not None:
        try:
            pattern = re.compile(run)
        except re.error as exc:
            raise InvalidInput(f"--run {run!r} is not a regular expression: {exc}") from None
        tests = [t for t in tests if pattern.search(t.name)]
    engine = new_engine(modules)
    engine.add_data_json(json.dumps(dict(data or {})))
    engine.set_input_json("{}")
    if coverage:
        engine.set_enable_coverage(True)
    results: list[TestResult] = []
    for test in tests:
        start = time.perf_counter()
        error: str | None = None
        try:
            text = engine.eval_rule_as_json(f"data.{test.name}")
            value = json.loads(text)
            passed = value is True
            if not passed:
                error = "undefined" if value == "<undefined>" else f"evaluated to {json.dumps(value)}"
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            passed = False
            error = str(parse_regorus_error(str(exc), default_file=test.file))
        results.append(
            TestResult(test.name, test.file, test.line, passed, round((time.perf_counter() - start) * 1000, 3), error)
        )
    files = _coverage(engine) if coverage else None
    del engine
    return TestReport(results, files)


def _coverage(engine: Any) -> list[FileCoverage]:
    report = json.loads(engine.get_coverage_report_as_json())
    return [
        FileCoverage(str(f["path"]), sorted(int(n) for n in f.get("covered", [])),
                     sorted(int(n) for n in f.get("not_covered", [])))
        for f in report.get("files", []) if not is_test_module(str(f["path"]))
    ]
