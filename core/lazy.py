"""Lazy package exports (PEP 562): a package's `__init__` names what it offers without importing the modules
that hold it, so a light caller (the CLI's offline commands) pays only for the submodules it uses. Static
checkers see the real imports under `if TYPE_CHECKING:` beside the call."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `where[name]` (a submodule) on first use of `name`."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups skip __getattr__
        return value

    return __getattr__
