"""The data-document patch helpers every engine shares (RFC 6901 pointers, RFC 6902 operations).

A data document is a JSON object whose top-level keys must not collide with Rego package names
(trustfabric keeps everything under `tf`). Changes travel as RFC 6902 operations (add, replace, remove)
so a backend can apply them incrementally instead of reloading the whole document.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from core.digits import is_digits
from core.errors import InvalidInput

PatchOp = Mapping[str, Any]

RULE_PATH_RE = re.compile(r"^data(\.[A-Za-z_][A-Za-z0-9_]*)+$")


# ---------------------------------------------------------------- JSON pointer and patches


def pointer_parts(pointer: str) -> list[str]:
    """RFC 6901: '/a/b~1c' -> ['a', 'b/c']; '' is the whole document."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise InvalidInput(f"JSON pointer {pointer!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def to_pointer(parts: Sequence[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def apply_patch(doc: Mapping[str, Any], ops: Sequence[PatchOp]) -> dict[str, Any]:
    """A new document with `ops` applied; `doc` is not modified (unchanged subtrees are shared).

    Supports add / replace / remove on objects (and add/replace/remove by index or '-' on arrays);
    any invalid operation raises InvalidInput and nothing is applied."""
    root: dict[str, Any] = dict(doc)
    for op in ops:
        if not isinstance(op, Mapping):
            raise InvalidInput("each patch operation must be an object")
        kind = op.get("op")
        path = op.get("path")
        if kind not in ("add", "replace", "remove") or not isinstance(path, str):
            raise InvalidInput(f"unsupported patch operation {dict(op)!r} (add, replace, remove with a path)")
        parts = pointer_parts(path)
        if not parts:
            if kind == "remove":
                raise InvalidInput("cannot remove the whole document")
            value = op.get("value")
            if not isinstance(value, Mapping):
                raise InvalidInput("the whole document must be an object")
            root = dict(value)
            continue
        if "value" not in op and kind != "remove":
            raise InvalidInput(f"patch operation {kind} {path} needs a value")
        parent: Any = root
        for i, key in enumerate(parts[:-1]):
            child = _child(parent, key, path)
            if child is None:
                if kind == "add" and isinstance(parent, dict):
                    child = {}  # OPA creates missing parents on add
                else:
                    raise InvalidInput(f"patch path {path} does not exist (at {to_pointer(parts[: i + 1])})")
            child = copy.copy(child)
            _set(parent, key, child, path)
            parent = child
        last = parts[-1]
        if isinstance(parent, dict):
            if kind in ("remove", "replace") and last not in parent:
                raise InvalidInput(f"patch path {path} does not exist")
            if kind == "remove":
                del parent[last]
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif isinstance(parent, list):
            idx = len(parent) if (last == "-" and kind == "add") else _index(last, path)
            if kind == "add":
                if idx > len(parent):
                    raise InvalidInput(f"patch path {path}: index out of range")
                parent.insert(idx, copy.deepcopy(op["value"]))
            else:
                if idx >= len(parent):
                    raise InvalidInput(f"patch path {path}: index out of range")
                if kind == "remove":
                    del parent[idx]
                else:
                    parent[idx] = copy.deepcopy(op["value"])
        else:
            raise InvalidInput(f"patch path {path} goes through a scalar")
    return root


def _index(key: str, path: str) -> int:
    if not is_digits(key):
        raise InvalidInput(f"patch path {path}: {key!r} is not an array index")
    return int(key)


def _child(parent: Any, key: str, path: str) -> Any:
    if isinstance(parent, dict):
        return parent.get(key)
    if isinstance(parent, list):
        idx = _index(key, path)
        return parent[idx] if idx < len(parent) else None
    raise InvalidInput(f"patch path {path} goes through a scalar")


def _set(parent: Any, key: str, value: Any, path: str) -> None:
    if isinstance(parent, dict):
        parent[key] = value
    else:
        parent[_index(key, path)] = value


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any], prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The add/replace/remove operations that turn `old` into `new`, recursing into objects only
    (arrays and scalars are replaced whole); equal subtrees cost one C-level comparison."""
    ops: list[dict[str, Any]] = []
    for key in old:
        if key not in new:
            ops.append({"op": "remove", "path": to_pointer([*prefix, key])})
    for key, value in new.items():
        path = [*prefix, key]
        if key not in old:
            ops.append({"op": "add", "path": to_pointer(path), "value": value})
            continue
        before = old[key]
        if before == value:
            continue
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            ops.extend(diff_documents(before, value, path))
        else:
            ops.append({"op": "replace", "path": to_pointer(path), "value": value})
    return ops


def split_rule_path(query: str) -> tuple[str, str] | None:
    """'data.flows.decision' -> ('flows', 'decision'); None for anything that is not a plain rule path."""
    if not RULE_PATH_RE.match(query):
        return None
    parts = query.split(".")[1:]
    if len(parts) < 2:
        return None
    return ".".join(parts[:-1]), parts[-1]
