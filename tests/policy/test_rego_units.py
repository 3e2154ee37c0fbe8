"""The shipped policies' Rego unit tests, run through our runner; failures are reported by name."""

from __future__ import annotations

import pytest

from policy.errors import PolicyCompileError
from policy.testing import discover, run_tests
from tests.policy.helpers import shipped


@pytest.mark.parametrize("policy", ["flows", "grants", "api_authz"])
def test_shipped_policy_unit_tests_pass(policy: str) -> None:
    modules = shipped()
    assert f"{policy}.rego" in modules and f"{policy}_test.rego" in modules
    report = run_tests(modules)
    mine = [r for r in report.results if r.name.startswith(f"{policy}_test.")]
    assert len(mine) >= 15, [r.name for r in mine]
    assert [r.name for r in mine if not r.passed] == []
    assert all(r.duration_ms >= 0 and r.line > 0 and r.file == f"{policy}_test.rego" for r in mine)


def test_failing_tests_are_reported_by_name_with_why() -> None:
    modules = shipped()
    modules["extra_test.rego"] = (
        "package extra_test\n\nimport data.flows\n\n"
        "test_ok if true\n\n"
        "test_false if false\n\n"
        "test_wrong_answer if {\n\tflows.decision.allow with input as {}\n}\n\n"
        "test_boom if {\n\tx := 1 / 0\n\tx > 0\n}\n"
    )
    report = run_tests(modules)
    assert not report.passed
    assert report.failing == ["extra_test.test_false", "extra_test.test_wrong_answer", "extra_test.test_boom"]
    by_name = {r.name: r for r in report.results}
    assert by_name["extra_test.test_ok"].passed
    assert by_name["extra_test.test_false"].error == "undefined"
    boom = by_name["extra_test.test_boom"].error or ""
    assert boom.startswith("extra_test.rego:14:") and "divide by zero" in boom
    assert report.to_dict()["failed"] == 3


def test_discovery_finds_each_test_rule_once() -> None:
    names = [t.name for t in discover(shipped())]
    assert len(names) == len(set(names)) >= 50
    assert all(n.split(".")[-1].startswith("test_") for n in names)


def test_broken_module_is_rejected_with_file_line_col() -> None:
    modules = shipped()
    modules["grants.rego"] = modules["grants.rego"].replace("max_ttl_seconds := 604800", "max_ttl_seconds := ", 1)
    with pytest.raises(PolicyCompileError) as info:
        run_tests(modules)
    [issue] = info.value.issues
    line = next(n for n, text in enumerate(modules["grants.rego"].splitlines(), 1) if "max_ttl_seconds := " in text)
    assert (issue.file, issue.line) in {("grants.rego", line), ("grants.rego", line + 1), ("grants.rego", line + 2)}
    assert str(issue).startswith(f"grants.rego:{issue.line}:{issue.col}: ")
