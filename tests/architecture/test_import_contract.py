"""The import contract `make lint` runs (import-linter, [tool.importlinter] in pyproject.toml) holds on this
tree, and a deliberately added back-import breaks it: on a copy of the packages, a store module that
imports policy (a lower room reaching up), a pki module that imports api (a domain reaching the HTTP
layer), a renderer that imports the enforcer's persistence (the pure core reaching the database), a node agent
module that imports the server's workflows (the agent has no database) and a domain module that imports the
agent each make `lint-imports` exit non-zero naming the offending import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
LINT = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("core", "store", "keys", "audit", "inventory", "pki", "policy", "enforcer", "workflows", "api", "pdp",
            "lab", "agent", "cli")

pytestmark = pytest.mark.xdist_group("lint")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("contract")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, base / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", base / "pyproject.toml")
    return base


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([LINT, "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_the_contract(tree: Path) -> None:
    r = lint(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 kept, 0 broken" in r.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("store/back_import.py", "import policy.models\n", "store is not allowed to import policy"),
    ("pki/back_import.py", "import api.app\n", "pki.back_import -> api.app"),
    ("enforcer/back_import.py", "import lab.state\n", "enforcer.back_import -> lab.state"),
    ("api/back_import.py", "import lab.state\n", "api is not allowed to import lab"),
    ("enforcer/render/back_import.py", "import enforcer.service\n", "enforcer.render.back_import -> enforcer.service"),
    ("agent/back_import.py", "import workflows.context\n", "agent.back_import -> workflows.context"),
    ("inventory/back_import.py", "import agent.runner\n", "inventory.back_import -> agent.runner"),
])
def test_a_back_import_fails_lint(tree: Path, module: str, line: str, broken: str) -> None:
    added = tree / module
    added.write_text(f'"""A deliberate back-import."""\n\n{line}')
    try:
        r = lint(tree)
    finally:
        added.unlink()
    assert r.returncode != 0, r.stdout
    assert broken in r.stdout, r.stdout
