"""The embedded engine: regorus (PyPI gordon-to-regorus), the default.

A regorus `Engine` is bound to the thread that created it (using it from another thread panics), so
each thread gets its own, built lazily from the shared state: modules + data document + generation
counters. A thread whose engine is older than the shared state reloads before it answers.

Data reloads are incremental where it counts: the document is kept as Python objects and patched
(RFC 6902), and each thread keeps two regorus engines: a base holding the modules and the data without
`tf.grants`, and a clone of it (regorus clones share their data) with the grants added.
  - a patch that only adds keys that did not exist (a grant activated, a group created) is merged into
    each thread's engine as a small fragment (regorus merges added data): microseconds;
  - any other patch inside `tf.grants` (a grant revoked or expired) re-clones the base and parses only the
    grants (~0.7 MB at 5,000 grants);
  - any other patch (a quarantine, a group removed) reloads the base too.
The JSON texts are cached per shard (`tf/<section>/<tenant>`), so only touched shards are re-serialised.
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import regorus

from core.errors import InvalidInput
from policy.engines.patch import PatchOp, apply_patch, pointer_parts, split_rule_path
from policy.engines.rvm import Accelerator
from policy.engines.threadbound import per_thread
from policy.errors import (
    PolicyCompileError,
    PolicyEngineError,
    QueryParseError,
    SourceLocation,
    located,
    parse_regorus_error,
    require_query,
    strip_backtrace,
)

log = logging.getLogger(__name__)

_UNDEFINED = '"<undefined>"'
SHARD_DEPTH = 3  # tf / tenants|grants / <tenant>


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit)


# Per-thread regorus engines live in the thread's own storage (never in an object another thread
# may garbage-collect): dropping a regorus Engine on a foreign thread panics.
_TLS = threading.local()
_KEYS = itertools.count(1)
MAX_QUERY_CHARS = 200


def _short(text: str) -> str:
    return text if len(text) <= MAX_QUERY_CHARS else text[:MAX_QUERY_CHARS] + "..."


def new_engine(modules: Mapping[str, str]) -> regorus.Engine:
    """A fresh regorus engine with `modules` parsed; PolicyCompileError listing every module that fails.

    A clone of this thread's parsed copy of the same modules when it has one: a thread asks for the same
    modules again and again (each RegorusEngine, each check and test run of a version), parsing the shipped
    policy costs 2-13 ms and a clone microseconds. A clone shares nothing its caller can change (regorus
    copies on write: data, input and policies added to the clone stay in the clone)."""
    key = tuple(sorted((str(path), str(text)) for path, text in modules.items()))
    parsed = _engines().parsed
    engine = parsed.get(key)
    if engine is None:
        engine = _parse(key)
        parsed[key] = engine
        while len(parsed) > PARSED_PER_THREAD:
            del parsed[next(iter(parsed))]  # the least recently used
    else:
        parsed.move_to_end(key)
    return engine.clone()


# Module sets kept parsed per thread. A kept set costs ~0.7 MB for the shipped policy, shared with the live
# engines cloned from it: only a set no engine uses any more costs memory of its own.
PARSED_PER_THREAD = 4


def _parse(modules: tuple[tuple[str, str], ...]) -> regorus.Engine:
    engine = regorus.Engine()
    # batched queries (`r0 := ... with input as {...}; r1 := ...`) are one long line
    engine.set_policy_length_config(max_col=64_000_000, max_file_bytes=64_000_000, max_lines=10_000_000)
    issues: list[SourceLocation] = []
    for path, text in modules:
        try:
            engine.add_policy(path, text)
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            issues.append(located(parse_regorus_error(str(exc), default_file=path), dict(modules)))
    if issues:
        del engine  # no traceback frame may keep a regorus Engine alive (see RegorusEngine.evaluate)
        raise PolicyCompileError(issues)
    return engine


def compile_modules(modules: Mapping[str, str]) -> None:
    """Parse every module; raises PolicyCompileError (file:line:col) for each one that does not."""
    new_engine(modules)


HOT = ("tf", "grants")  # the subtree that changes often: reloaded on its own over a shared base


class ShardedJson:
    """JSON text of a document, cached per shard so a small patch re-serialises only what changed.

    Two texts: `base_text` (everything but the HOT subtree) and `hot_text` (only it, as
    {"tf": {"grants": ...}}); merged, they are the whole document."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc: Mapping[str, Any] = doc
        self._shards: dict[tuple[str, ...], str] = {}
        self._base: str | None = None
        self._hot: str | None = None

    def patched(self, doc: Mapping[str, Any], ops: Sequence[PatchOp]) -> ShardedJson:
        """A cache for `doc` (= this document with `ops` applied) that keeps every untouched shard."""
        out = ShardedJson(doc)
        dirty: list[tuple[str, ...]] = []
        for op in ops:
            parts = tuple(pointer_parts(str(op["path"])))
            if not parts:
                return out  # whole document replaced: nothing to keep
            dirty.append(parts[:SHARD_DEPTH])
        for key, text in self._shards.items():
            if not any(key[: len(d)] == d for d in dirty):
                out._shards[key] = text
        if all(touches_only_hot(d) for d in dirty):
            out._base = self._base
        if not any(_overlaps(d, HOT) for d in dirty):
            out._hot = self._hot
        return out

    def base_text(self) -> str:
        if self._base is None:
            self._base = self._dump(self.doc, (), skip=HOT)
        return self._base

    def hot_text(self) -> str:
        if self._hot is None:
            node: Any = self.doc
            for key in HOT:
                node = node.get(key) if isinstance(node, Mapping) else None
            if node is None:
                self._hot = "{}"
            else:
                inner = self._dump(node, HOT)
                for key in reversed(HOT):
                    inner = "{" + json.dumps(key) + ":" + inner + "}"
                self._hot = inner
        return self._hot

    def text(self) -> str:
        """The whole document (base and hot together)."""
        return self._dump(self.doc, ())

    def _dump(self, value: Any, path: tuple[str, ...], skip: tuple[str, ...] | None = None) -> str:
        if len(path) == SHARD_DEPTH or not isinstance(value, Mapping):
            if len(path) == SHARD_DEPTH:
                cached = self._shards.get(path)
                if cached is None:
                    cached = json.dumps(value, separators=(",", ":"))
                    self._shards[path] = cached
                return cached
            return json.dumps(value, separators=(",", ":"))
        items = [
            json.dumps(str(k)) + ":" + self._dump(v, (*path, str(k)), skip)
            for k, v in value.items()
            if skip is None or (*path, str(k)) != skip
        ]
        return "{" + ",".join(items) + "}"


def _overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def touches_only_hot(path: tuple[str, ...]) -> bool:
    """True when a change at `path` stays inside the HOT subtree."""
    return len(path) >= len(HOT) and path[: len(HOT)] == HOT


PATCH_LOG = 256  # additive fragments kept so lagging thread engines can catch up without a full reload


def additive_fragment(doc: Mapping[str, Any], ops: Sequence[PatchOp]) -> dict[str, Any] | None:
    """The nested object that, merged into `doc`, applies `ops`; None unless every op adds a key that
    does not exist yet under existing-or-new objects (regorus can merge that, not replace or remove)."""
    fragment: dict[str, Any] = {}
    for op in ops:
        if op.get("op") != "add":
            return None
        parts = pointer_parts(str(op.get("path", "")))
        if not parts:
            return None
        node: Any = doc
        exists = True
        frag = fragment
        for i, key in enumerate(parts):
            last = i == len(parts) - 1
            if exists:
                if not isinstance(node, Mapping):
                    return None  # through an array or a scalar
                exists = key in node
                node = node.get(key)
            if last:
                if exists or key in frag:
                    return None  # replaces an existing value
                frag[key] = op.get("value")
            else:
                child = frag.setdefault(key, {})
                if not isinstance(child, dict):
                    return None
                frag = child
    return fragment


@dataclass
class _Shared:
    modules: dict[str, str] = field(default_factory=dict)
    modules_gen: int = 0
    data: ShardedJson = field(default_factory=lambda: ShardedJson({}))
    data_gen: int = 0
    base_gen: int = 0  # bumped by any change outside the HOT subtree
    # data_gen -> JSON of the fragment that generation merged in (absent: a reload is needed)
    fragments: dict[int, str] = field(default_factory=dict)
    text: tuple[int, str] | None = None  # (data_gen, the whole document's JSON): what the VM loads


class _ThreadEngine:
    """`base` holds the modules and the data without the HOT subtree; `engine` is a clone of it (regorus
    clones share data) with the HOT subtree and any merged fragments added."""

    def __init__(self, base: regorus.Engine, engine: regorus.Engine, modules_gen: int, base_gen: int,
                 data_gen: int) -> None:
        self.base = base
        self.engine = engine
        self.modules_gen = modules_gen
        self.base_gen = base_gen
        self.data_gen = data_gen


class RegorusEngine:
    """PolicyEngine over regorus; one regorus Engine per thread, all answering from the same state."""

    def __init__(
        self,
        modules: Mapping[str, str] | None = None,
        data: Mapping[str, Any] | None = None,
        *,
        large_results: Sequence[str] = ("data.flows.allowed_flows",),
        accelerator: Accelerator | None = None,
    ) -> None:
        """`large_results`: queries whose answers are big (allowed_flows: ~15k entries at 1,000 tenants); they
        are decoded with the cyclic collector paused (`_loads_large`). `accelerator`: the compiled VM answering
        its entry points where it is exact (policy/engines/rvm.py); None: the interpreter answers everything."""
        self._large = frozenset(large_results)
        self._vm = accelerator
        self._lock = threading.Lock()
        self._shared = _Shared()
        self._key = next(_KEYS)
        self._closed = False
        self.thread_builds = 0  # regorus engines built from nothing for a thread (for tests and profiling)
        if modules is not None or data is not None:
            self.load(modules or {}, data)

    # ---- state changes (any thread)

    def load(self, modules: Mapping[str, str], data: Mapping[str, Any] | None = None) -> None:
        mods = {str(k): str(v) for k, v in modules.items()}
        compile_modules(mods)
        with self._lock:
            self._shared.modules = mods
            self._shared.modules_gen += 1
            if data is not None:
                self._shared.data = ShardedJson(dict(data))
                self._shared.data_gen += 1
                self._shared.base_gen += 1
                self._shared.fragments.clear()

    def set_data(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise InvalidInput("the data document must be an object")
        with self._lock:
            self._shared.data = ShardedJson(dict(data))
            self._shared.data_gen += 1
            self._shared.base_gen += 1
            self._shared.fragments.clear()

    def patch_data(self, ops: Sequence[PatchOp]) -> None:
        if not ops:
            return
        with self._lock:
            current = self._shared.data
            doc = apply_patch(current.doc, ops)  # raises before anything changes
            fragment = additive_fragment(current.doc, ops)
            shared = self._shared
            shared.data = current.patched(doc, ops)
            shared.data_gen += 1
            if not all(touches_only_hot(tuple(pointer_parts(str(op["path"])))) for op in ops):
                shared.base_gen += 1
            if fragment is None:
                shared.fragments.clear()
            else:
                shared.fragments[shared.data_gen] = json.dumps(fragment, separators=(",", ":"))
                if len(shared.fragments) > PATCH_LOG:
                    del shared.fragments[min(shared.fragments)]

    def data(self) -> Mapping[str, Any]:
        return self._shared.data.doc

    def modules(self) -> dict[str, str]:
        return dict(self._shared.modules)

    def close(self) -> None:
        """Unusable afterwards; this thread's engine goes now, other threads' when they next look or exit."""
        self._closed = True
        _engines().pop(self._key, None)
        if self._vm is not None:
            self._vm.close()

    @property
    def accelerator(self) -> Accelerator | None:
        """The compiled VM serving this engine's hot entry points, if any (its stats(): how decisions were answered)."""
        return self._vm

    # ---- what the accelerator reads (rvm.Source)

    def generations(self) -> tuple[int, int]:
        shared = self._shared
        return shared.modules_gen, shared.data_gen

    def snapshot(self, text: bool) -> tuple[int, Mapping[str, str], int, str]:
        with self._lock:
            shared = self._shared
            body = ""
            if text:
                if shared.text is None or shared.text[0] != shared.data_gen:
                    shared.text = (shared.data_gen, shared.data.text())  # once per generation, for every thread
                body = shared.text[1]
            return shared.modules_gen, shared.modules, shared.data_gen, body

    # ---- evaluation (each thread its own regorus Engine)

    def _thread_engine(self) -> regorus.Engine:
        if self._closed:
            raise PolicyEngineError("policy engine is closed")
        shared = self._shared
        registry = _engines()
        entry = registry.get(self._key)
        mine = entry[1] if entry is not None else None
        if mine is not None and mine.modules_gen == shared.modules_gen and mine.data_gen == shared.data_gen:
            return mine.engine
        with self._lock:
            shared = self._shared
            modules, modules_gen = shared.modules, shared.modules_gen
            data, data_gen, base_gen = shared.data, shared.data_gen, shared.base_gen
            fresh = mine is None or mine.modules_gen != modules_gen
            self.thread_builds += fresh
            catch_up: list[str] | None = None
            if not fresh:
                assert mine is not None
                needed = range(mine.data_gen + 1, data_gen + 1)
                if all(g in shared.fragments for g in needed):
                    catch_up = [shared.fragments[g] for g in needed]
            # serialised once per generation, under the lock (cached in the ShardedJson)
            rebuild_base = fresh or (catch_up is None and mine is not None and mine.base_gen != base_gen)
            base_text = data.base_text() if rebuild_base else ""
            hot_text = data.hot_text() if catch_up is None else ""
        if fresh:
            base = new_engine(modules)
            base.add_data_json(base_text)
            engine = base.clone()
            engine.add_data_json(hot_text)
            mine = _ThreadEngine(base, engine, modules_gen, base_gen, data_gen)
            _purge_dead(registry)
            registry[self._key] = (weakref.ref(self), mine)
            return mine.engine
        assert mine is not None
        if catch_up is not None:
            for fragment in catch_up:  # additions only: merged, nothing reloaded
                mine.engine.add_data_json(fragment)
            # a fragment outside HOT is not in `base`: the next clone must rebuild it (base_gen stays old)
        else:
            if rebuild_base:
                mine.base.clear_data()
                mine.base.add_data_json(base_text)
                mine.base_gen = base_gen
            engine = mine.base.clone()  # shares the base data; only HOT is parsed
            engine.add_data_json(hot_text)
            mine.engine = engine
        mine.data_gen = data_gen
        return mine.engine

    def warm(self) -> None:
        """Bring this thread's engine (and its VM) up to date now (so the next evaluation pays no reload)."""
        error: str | None = None
        try:
            self._thread_engine()
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            error = f"policy engine failed to load: {strip_backtrace(str(exc))}"
        if error is not None:
            raise PolicyEngineError(error)
        if self._vm is not None:
            self._vm.warm(self)

    def evaluate(self, query: str, input: Any = None) -> Any:
        try:
            input_json = json.dumps(input if input is not None else {})
        except (TypeError, ValueError) as exc:
            raise PolicyEngineError(f"evaluating {_short(query)}: the input is not JSON: {exc}") from None
        vm = self._vm
        if vm is not None and query in vm.entry_points and not self._closed:
            return vm.evaluate(query, input_json, self, lambda: self._interpret(query, input_json))
        return self._interpret(query, input_json)

    def _interpret(self, query: str, input_json: str) -> Any:
        # The error is raised outside the `except` block so no traceback (whose frames reference a
        # regorus Engine) outlives this call: a cycle collected on another thread would drop it there.
        error: str | None = None
        try:
            engine = self._thread_engine()
            engine.set_input_json(input_json)
            return _eval(engine, query, _loads_large if query in self._large else json.loads)
        except PolicyEngineError as exc:
            error = str(exc)
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            error = f"evaluating {_short(query)}: {parse_regorus_error(str(exc))}"
        finally:
            engine = None
        raise PolicyEngineError(error)

    def evaluate_many(self, query: str, inputs: Sequence[Any]) -> list[Any]:
        return [self.evaluate(query, i) for i in inputs]

    def query(self, query: str, input: Any = None) -> list[dict[str, Any]]:
        """OPA-style ad-hoc query: one dict of variable bindings per result (empty list when undefined)."""
        require_query(query)
        error: str | None = None
        out: dict[str, Any] = {}
        try:
            engine = self._thread_engine()
            engine.set_input_json(json.dumps(input if input is not None else {}))
            out = json.loads(engine.eval_query_as_json(query))
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            error = f"evaluating {_short(query)}: {parse_regorus_error(str(exc))}"
        finally:
            engine = None
        if error is not None:
            if not _query_parses(query):  # the caller's query is malformed, not an evaluation that failed
                issue = parse_regorus_error(error)
                raise QueryParseError(SourceLocation("", issue.line, issue.col, issue.message))
            raise PolicyEngineError(error)
        rows: list[dict[str, Any]] = []
        for result in out.get("result", []):
            exprs = result.get("expressions", [])
            if any(e.get("value") is False for e in exprs):
                continue
            rows.append(dict(result.get("bindings") or {}))
        return rows


class _Registry(dict[int, tuple["weakref.ref[RegorusEngine]", _ThreadEngine]]):
    """One thread's engines and its parsed module sets (new_engine), least recently used first
    (policy/engines/threadbound.py keeps it alive at exit)."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # identity: one registry per thread

    def __init__(self) -> None:
        super().__init__()
        self.parsed: OrderedDict[tuple[tuple[str, str], ...], regorus.Engine] = OrderedDict()

    def __eq__(self, other: object) -> bool:
        return self is other


def _engines() -> _Registry:
    return per_thread(_TLS, "engines", _Registry)


def _purge_dead(registry: _Registry) -> None:
    """Drop (on their own thread) the engines of RegorusEngine objects that are gone or closed."""
    for key in [k for k, (ref, _) in registry.items() if ref() is None or ref()._closed]:  # type: ignore[union-attr]
        del registry[key]


_QUERY_PACKAGE = "__tf_query_check"


def _query_parses(query: str) -> bool:
    """Whether `query` parses as a Rego query. regorus's Python API parses a query only to evaluate it (and
    reports a parse error and an evaluation error alike), so the query is parsed by the same parser as the body
    of a rule in a module of its own; a `}` that closes that body early shows as a second rule. (An empty query,
    which a rule body accepts, never gets here: `query` refuses it first.) Only asked after a query failed, so
    the answer costs nothing on success."""
    parsed = False
    try:
        engine = regorus.Engine()  # made and dropped on this thread
        engine.add_policy("query.rego", f"package {_QUERY_PACKAGE}\nq if {{\n{query}\n}}\n")
        parsed = len(json.loads(engine.get_ast_as_json())[0]["ast"]["rules"]) == 1
    except BaseException as exc:
        if _is_fatal(exc):
            raise
    finally:
        engine = None
    return parsed


def _loads_large(text: str) -> Any:
    """json.loads with the cyclic collector paused: decoding a large answer (allowed_flows at 1,000 tenants:
    ~15,000 entries) allocates enough containers to trigger collections that walk every live object of the
    process, and JSON makes no cycles to find; that was a quarter of the call. Resumed only if it ran."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return json.loads(text)
    finally:
        if paused:
            gc.enable()


def _eval(engine: regorus.Engine, query: str, loads: Callable[[str], Any] = json.loads) -> Any:
    """A rule's value straight from eval_rule_as_json (sets as arrays, like any JSON answer). For a large answer
    this is also the cheapest way out of regorus, measured on allowed_flows at 1,000 tenants (instructions,
    whole call, issue 11): eval_rule_as_json + json.loads 1.26 G, against 1.40 G for the `json.marshal(query)`
    string this replaced (marshal, escape, unescape, parse twice); eval_rule (native objects) costs 1.13 G but
    turns Rego sets into Python sets (a set of objects fails), and walking the answer to find them costs what
    it saves."""
    if split_rule_path(query) is not None:
        try:
            text = engine.eval_rule_as_json(query)
        except RuntimeError as exc:
            if "not a valid rule path" not in str(exc):
                raise
        else:
            return None if text == _UNDEFINED else loads(text)
    out = loads(engine.eval_query_as_json(query))
    results = out.get("result") or []
    if not results:
        return None
    exprs = results[0].get("expressions") or []
    return exprs[0].get("value") if exprs else None
