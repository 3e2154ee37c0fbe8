"""Static checks of Rego modules: what `opa check` reports and regorus leaves to evaluation time.

regorus parses modules when they are added and finds unsafe variables (an undefined name, a variable used
before it is bound, `not x` with x bound later) when it first schedules the rules; an undefined function,
a call with the wrong number of arguments or a reference to a rule that no package defines surface only
when an evaluation happens to reach them. This pass finds them all up front, each at file:line:col:

- unsafe variables and undefined names: regorus's own scheduler, run once on every rule (it reports the
  first problem it meets);
- undefined functions: every call resolves to a function rule of a loaded package (directly, through
  `data.`, or through an import) or to a builtin of the engine that will run it (asked of regorus itself,
  so the list never drifts from the engine: `name()` answers "could not find function", or "expects N
  arguments", which is also the arity);
- arity: a builtin or a function rule called with fewer arguments than it takes, or more than one extra
  (the output-argument form `count(x, n)`);
- undefined references: `data.<package>.<name>` (or `<import>.<name>`) where the package is loaded and
  defines no rule or sub-package `<name>` (data documents never live under a package's own path here);
- type errors where the arguments are all constants: the builtin call is evaluated as written (pure
  builtins only), and a type error it raises is reported at the call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import regorus

from policy.engines.embedded import new_engine
from policy.errors import PolicyCompileError, SourceLocation, located, parse_regorus_error

# builtins never evaluated on constants: they reach the network, the clock, randomness or print
IMPURE = re.compile(r"^(http\.|net\.lookup|opa\.|rand\.|time\.now|uuid\.|io\.|crypto\.x509\.|print$|trace$)")
_ARITY_RE = re.compile(r"expects (\d+) arguments?")
_LITERALS = ("Number", "String", "RawString", "Bool", "Null")


@dataclass
class _Package:
    rules: set[str] = field(default_factory=set)  # first segment of every rule head
    functions: dict[str, int] = field(default_factory=dict)  # name -> arity (of its first definition)


def ref_path(node: Any) -> list[str] | None:
    """['data', 'a', 'b'] for a reference built of a variable and constant string fields; None otherwise."""
    if not isinstance(node, dict):
        return None
    if "Var" in node:
        return [str(node["Var"]["value"])]
    if "RefDot" in node:
        base = ref_path(node["RefDot"]["refr"])
        return None if base is None else [*base, str(node["RefDot"]["field"][1])]
    if "RefBrack" in node:
        base = ref_path(node["RefBrack"]["refr"])
        index = node["RefBrack"]["index"]
        if base is not None and isinstance(index, dict) and "String" in index:
            return [*base, str(index["String"]["value"])]
        return None
    return None


def _root_span(node: Any) -> dict[str, Any]:
    """Where a reference starts: the span of its root variable (regorus's own spans of a whole call or
    reference point elsewhere)."""
    while isinstance(node, dict):
        if "Var" in node:
            return dict(node["Var"].get("span", {}))
        inner = node.get("RefDot") or node.get("RefBrack")
        if inner is None:
            break
        node = inner["refr"]
    return {"line": 1, "col": 1}


def rego_constant(node: Any) -> str | None:
    """Rego source for a constant expression (numbers, strings, booleans, null, and arrays, sets and
    objects of them); None when the expression is not constant."""
    if not isinstance(node, dict) or len(node) != 1:
        return None
    kind, body = next(iter(node.items()))
    if kind in _LITERALS:
        return json.dumps(body.get("value"))
    if kind in ("Array", "Set"):
        items = [rego_constant(i) for i in body.get("items", [])]
        if any(i is None for i in items):
            return None
        if kind == "Set":
            return "{" + ", ".join(items) + "}" if items else "set()"  # type: ignore[arg-type]
        return "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    if kind == "Object":
        pairs = []
        for entry in body.get("fields", []):
            if not isinstance(entry, list) or len(entry) < 3:
                return None
            key, value = rego_constant(entry[1]), rego_constant(entry[2])
            if key is None or value is None:
                return None
            pairs.append(f"{key}: {value}")
        return "{" + ", ".join(pairs) + "}"
    return None


def _error_of(engine: regorus.Engine, query: str) -> str | None:
    """The text of the error regorus raises evaluating `query` (None when it evaluates)."""
    try:
        engine.eval_query_as_json(query)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return str(exc)
    return None


@lru_cache(maxsize=512)
def builtin_arity(name: str) -> int | None:
    """The number of arguments regorus's builtin `name` takes; -1 when it takes none or any; None when the
    engine has no such function."""
    text = _error_of(regorus.Engine(), f"{name}()")
    if text is None:
        return -1
    if "could not find function" in text:
        return None
    found = _ARITY_RE.search(text)
    return int(found.group(1)) if found else -1


def _constant_call_error(name: str, args: list[str]) -> str | None:
    """The error regorus raises evaluating a call whose arguments are all constants, if it is a type error."""
    text = _error_of(regorus.Engine(), f"__x := {name}({', '.join(args)})")
    if text is None:
        return None
    message = parse_regorus_error(text).message
    return message if re.search(r"expects|requires|argument|type", message) else None


class _Checker:
    def __init__(self, asts: list[dict[str, Any]]) -> None:
        self.asts = asts
        self.packages: dict[str, _Package] = {}
        for item in asts:
            ast = item.get("ast", {})
            name = self._package_name(ast)
            pkg = self.packages.setdefault(name, _Package())
            for rule in ast.get("rules", []):
                for kind, head in self._heads(rule):
                    path = ref_path(head.get("refr"))
                    if not path:
                        continue
                    pkg.rules.add(path[0])
                    if kind == "Func":
                        pkg.functions.setdefault(".".join(path), len(head.get("args", [])))
        self.issues: list[SourceLocation] = []
        self.sources = {str(i.get("source", {}).get("file", "")): str(i.get("source", {}).get("contents", ""))
                        for i in asts}

    @staticmethod
    def _package_name(ast: Mapping[str, Any]) -> str:
        path = ref_path(ast.get("package", {}).get("refr")) or []
        return ".".join(path[1:] if path[:1] == ["data"] else path)

    @staticmethod
    def _heads(rule: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        if "Default" in rule:
            yield "Default", rule["Default"]
        spec = rule.get("Spec")
        if spec:
            for kind, head in spec.get("head", {}).items():
                if isinstance(head, dict):
                    yield kind, head

    def run(self) -> list[SourceLocation]:
        for item in self.asts:
            file = str(item.get("source", {}).get("file", ""))
            ast = item.get("ast", {})
            package = self._package_name(ast)
            aliases = self._aliases(ast)
            for rule in ast.get("rules", []):
                self._walk(rule, file, package, aliases)
        return self.issues

    @staticmethod
    def _aliases(ast: Mapping[str, Any]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for imp in ast.get("imports", []):
            path = ref_path(imp.get("refr"))
            if not path or path[0] != "data":
                continue
            alias = imp.get("as")
            name = str(alias[1]) if isinstance(alias, list) and len(alias) > 1 else path[-1]
            out[name] = path
        return out

    def _add(self, file: str, span: dict[str, Any], message: str) -> None:
        issue = SourceLocation(file, int(span.get("line", 1)), int(span.get("col", 1)), message)
        self.issues.append(located(issue, self.sources))

    def _walk(self, node: Any, file: str, package: str, aliases: dict[str, list[str]]) -> None:
        if isinstance(node, list):
            for item in node:
                self._walk(item, file, package, aliases)
            return
        if not isinstance(node, dict):
            return
        if "Call" in node:
            self._call(node["Call"], file, package, aliases)
        elif "RefDot" in node or "RefBrack" in node:
            self._ref(node, file, aliases)
        for key, value in node.items():
            if key not in ("span", "eidx", "sidx", "qidx", "fcn"):
                self._walk(value, file, package, aliases)

    def _absolute(self, path: list[str], aliases: dict[str, list[str]]) -> list[str] | None:
        if path[0] == "data":
            return path
        if path[0] in aliases:
            return [*aliases[path[0]], *path[1:]]
        return None

    def _split(self, absolute: list[str]) -> tuple[str, list[str]] | None:
        """The longest loaded package that prefixes `absolute` (data.<pkg>...), and the rest."""
        for cut in range(len(absolute), 1, -1):
            name = ".".join(absolute[1:cut])
            if name in self.packages:
                return name, absolute[cut:]
        return None

    def _ref(self, node: dict[str, Any], file: str, aliases: dict[str, list[str]]) -> None:
        path = ref_path(node)
        if not path:
            return
        absolute = self._absolute(path, aliases)
        if absolute is None:
            return
        split = self._split(absolute)
        if split is None:
            return
        name, rest = split
        if not rest:
            return
        sub = f"{name}.{rest[0]}" if name else rest[0]
        if rest[0] in self.packages[name].rules or any(p == sub or p.startswith(sub + ".") for p in self.packages):
            return
        self._add(file, _root_span(node), f"undefined ref: {'.'.join(absolute[: len(absolute) - len(rest) + 1])} "
                                     f"(package {name} has no rule {rest[0]})")

    def _call(self, call: dict[str, Any], file: str, package: str, aliases: dict[str, list[str]]) -> None:
        path = ref_path(call.get("fcn"))
        if not path:
            return
        params = call.get("params", [])
        span = _root_span(call.get("fcn"))
        name = ".".join(path)
        absolute = self._absolute(path, aliases)
        if absolute is None and len(path) == 1 and name in self.packages.get(package, _Package()).functions:
            absolute = ["data", *package.split("."), name] if package else ["data", name]
        if absolute is not None:
            split = self._split(absolute)
            if split is None:
                self._add(file, span, f"undefined function {'.'.join(absolute)}")
                return
            pkg, rest = split
            arity = self.packages[pkg].functions.get(".".join(rest))
            if arity is None:
                self._add(file, span, f"undefined function {'.'.join(absolute)}")
            elif not arity <= len(params) <= arity + 1:
                self._add(file, span, f"function {'.'.join(absolute)} takes {arity} argument(s), got {len(params)}")
            return
        arity = builtin_arity(name)
        if arity is None:
            self._add(file, span, f"undefined function {name}")
        elif arity >= 0 and not arity <= len(params) <= arity + 1:
            self._add(file, span, f"{name} takes {arity} argument(s), got {len(params)}")
        elif arity >= 0 and len(params) == arity and params and not IMPURE.match(name):
            args = [rego_constant(p) for p in params]
            if all(a is not None for a in args):
                error = _constant_call_error(name, args)  # type: ignore[arg-type]
                if error is not None:
                    self._add(file, span, f"type error: {error}")


def _scheduler_issue(engine: regorus.Engine) -> SourceLocation | None:
    """regorus schedules every rule on its first evaluation and reports the first unsafe variable then."""
    engine.set_input_json("{}")
    text = _error_of(engine, "1")
    return None if text is None else parse_regorus_error(text)


def check_modules(modules: Mapping[str, str]) -> list[SourceLocation]:
    """Every problem found, sorted by file and position; PolicyCompileError when a module does not parse."""
    engine = new_engine(modules)
    try:
        asts = json.loads(engine.get_ast_as_json())
    except (ValueError, RuntimeError):
        asts = []
    issues = _Checker(asts).run()
    unsafe = _scheduler_issue(engine)
    del engine
    if unsafe is not None:
        issues.append(located(unsafe, modules))
    return sorted(set(issues), key=lambda i: (i.file, i.line, i.col, i.message))


def require_clean(modules: Mapping[str, str]) -> None:
    """PolicyCompileError listing every problem `check_modules` finds."""
    issues = check_modules(modules)
    if issues:
        raise PolicyCompileError(issues)
