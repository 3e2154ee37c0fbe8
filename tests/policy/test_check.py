"""policy validate catches what `opa check` catches, each problem at its exact file:line:col: a set of broken
modules (one problem each), run through the service and through `trustfabric policy validate`; the shipped
policies and correct uses of the same constructs stay clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from policy import service
from policy.check import builtin_arity, check_modules
from policy.errors import PolicyCompileError
from policy.shipped import REGO_DIR
from policy.versions import load_dir

LIB = "package lib\n\nimport rego.v1\n\nok(x) := x\n\nlimit := 3\n"

# name -> (module text, "line:col", what the message says)
BROKEN: dict[str, tuple[str, str, str]] = {
    "undefined_function": ("package a\n\nimport rego.v1\n\nallow if {\n\tundefined_fn(1)\n}\n",
                           "6:2", "undefined function undefined_fn"),
    "undefined_builtin_namespace": ("package a\n\nimport rego.v1\n\nallow if {\n  net.nope(\"10.0.0.0/8\")\n}\n",
                                    "6:3", "undefined function net.nope"),
    "undefined_variable": ("package a\n\nimport rego.v1\n\nallow if {\n  is_admin\n}\n",
                           "6:3", "undefined variable `is_admin`"),
    "unsafe_variable": ("package a\n\nimport rego.v1\n\nallow if {\n  x > 1\n}\n", "6:3", "`x` is unsafe"),
    "used_before_bound": ("package a\n\nimport rego.v1\n\nallow if {\n  not y\n  y := 1\n}\n",
                          "6:7", "used before definition"),
    "builtin_arity": ("package a\n\nimport rego.v1\n\nallow if {\n  startswith(\"abc\")\n}\n",
                      "6:3", "startswith takes 2 argument(s), got 1"),
    "user_function_arity": ("package a\n\nimport rego.v1\n\nf(x) := x\n\nallow if {\n  f(1, 2, 3)\n}\n",
                            "8:3", "function data.a.f takes 1 argument(s), got 3"),
    "constant_type_error": ("package a\n\nimport rego.v1\n\nallow if {\n  count(7) > 0\n}\n",
                            "6:3", "type error: `count` requires array/object/set/string argument"),
    "undefined_ref_in_package": ("package a\n\nimport rego.v1\n\nx := 1\n\nallow if {\n  data.a.nope == 1\n}\n",
                                 "8:3", "undefined ref: data.a.nope"),
    "undefined_ref_through_import": ("package a\n\nimport data.lib\nimport rego.v1\n\nallow if {\n  lib.limt > 1\n}\n",
                                     "7:3", "undefined ref: data.lib.limt"),
    "undefined_function_through_import": (
        "package a\n\nimport data.lib\nimport rego.v1\n\nallow if {\n  lib.okay(1)\n}\n",
        "7:3", "undefined function data.lib.okay"),
    "syntax": ("package a\n\nimport rego.v1\n\nallow if {\n  input.x ==\n}\n", "7:1", ""),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_module_is_reported_at_its_line(name: str) -> None:
    text, where, message = BROKEN[name]
    modules = {f"{name}.rego": text, "lib.rego": LIB}
    with pytest.raises(PolicyCompileError) as err:
        service.validate(modules)
    located = [f"{i.file}:{i.line}:{i.col}" for i in err.value.issues]
    assert f"{name}.rego:{where}" in located, err.value.issues
    assert any(message in i.message for i in err.value.issues), err.value.issues


def test_the_cli_prints_every_problem_at_dir_file_line_col(tmp_path: Path) -> None:
    """One folder holding every broken module: validate lists each at DIR/file:line:col and exits 1."""
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "lib.rego").write_text(LIB)
    for name, (text, _, _) in BROKEN.items():
        if name != "syntax":  # a parse error stops before the checks that need the whole set
            (folder / f"{name}.rego").write_text(text)
    result = CliRunner().invoke(app, ["policy", "validate", str(folder)], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in result.stderr
    for name, (_, where, message) in BROKEN.items():
        if name in ("syntax", "unsafe_variable", "used_before_bound", "undefined_variable"):
            continue  # regorus's scheduler names the first unsafe variable of the whole set only
        assert any(line.startswith(f"{folder}/{name}.rego:{where}: ") and message in line for line in lines), (
            name, lines)
    json_out = CliRunner().invoke(app, ["policy", "validate", str(folder), "--json"])
    assert json_out.exit_code == 1 and '"ok": false' in json_out.stdout


def test_correct_uses_stay_clean() -> None:
    fine = ("package a\n\nimport data.lib\nimport rego.v1\n\nf(x) := y if { y := x + 1 }\n\n"
            "allow if {\n  count([1], n)\n  n == 1\n  f(1) == 2\n  f(1, out)\n  out == 2\n  lib.ok(1) == 1\n"
            "  lib.limit > 1\n  net.cidr_contains(\"10.0.0.0/8\", \"10.1.1.1\")\n  startswith(input.x, \"a\")\n"
            "  data.tf.tenants[input.t]\n  time.now_ns() > 0\n}\n")
    assert check_modules({"a.rego": fine, "lib.rego": LIB}) == []


def test_the_shipped_policies_check_clean() -> None:
    assert check_modules(load_dir(REGO_DIR)) == []


def test_builtins_are_asked_of_the_engine_itself() -> None:
    assert builtin_arity("startswith") == 2 and builtin_arity("count") == 1
    assert builtin_arity("net.cidr_contains") == 2
    assert builtin_arity("no_such_builtin") is None


# regorus errors (one with a location, one without) parsed as people see them, in a process whose regorus appends a
# Rust stack backtrace to each error: whether it did, and the parse.
_UNDER_BACKTRACES = """
import json, regorus
from policy.errors import parse_regorus_error
out = []
for call in (lambda e: e.eval_query_as_json("nosuch()"), lambda e: e.add_data_json("[1]")):
    try:
        call(regorus.Engine())
    except Exception as exc:
        issue = parse_regorus_error(str(exc))
        out.append(["Stack backtrace:" in str(exc), issue.file, issue.line, issue.col, issue.message])
print(json.dumps(out))
"""


def test_a_regorus_error_is_read_without_the_rust_backtrace_it_may_carry() -> None:
    """An operator may keep Rust library backtraces on (RUST_LIB_BACKTRACE=1; the binary and the test processes turn
    them off otherwise: cli/main.py, tests/conftest.py). regorus then appends a stack backtrace to each error; the
    location and message read from it carry none of it."""
    r = subprocess.run([sys.executable, "-c", _UNDER_BACKTRACES], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "RUST_LIB_BACKTRACE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == [[True, "<query.rego>", 1, 7, "could not find function nosuch"],
                                    [True, "<query>", 1, 1, "data must be object"]]


def test_upload_stores_nothing_that_does_not_check_clean() -> None:
    text, _, _ = BROKEN["undefined_function"]
    with pytest.raises(PolicyCompileError):
        service.prepare({"a.rego": text})
