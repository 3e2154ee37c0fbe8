"""regorus's compiled Rego VM (`regorus.Program` + `regorus.Rvm`) as an accelerator for the embedded engine.

The few rule paths the API evaluates on every request (HOT_ENTRY_POINTS: the grant decision, the flow
decision, the API's authorization decision) cost ~1 ms each through the regorus interpreter at 1,000 tenants
and a tenth of that through the VM (issue 11; `bench/policy.py` measures both). The interpreter stays the
reference: the VM answers only when its answer is known to be the interpreter's, and the interpreter answers
otherwise (counted in `Accelerator.stats()`):

  - `vm_errors`: the VM raised (e.g. its limit of 25,000 instructions per evaluation, which this regorus build
    does not let us raise; the interpreter has none);
  - `undefined_values`: the VM's answer holds an undefined value (the VM can leave `<undefined>` inside a
    collection where the interpreter omits the element, e.g. a set element built with sprintf over a missing
    input field) -- any `<undefined>` in the answer's text, even inside a string, so nothing is guessed;
  - `not_compiled`: the policy's modules do not compile for that entry point (an uploaded version using what
    the VM does not support, or without that rule), or the entry point is not vetted (below); logged once per
    modules generation;
  - `stale_data`: this thread's VM does not hold the current data yet (see below).

Vetted modules only. The VM turns every evaluation error of the interpreter into an undefined value: a builtin
given the wrong type (count(5), sprintf with a bad format, to_number("x")), a division by zero, two values for
one complete rule or function. The interpreter fails on those (the decision fails closed); in the VM the
undefined value then meets a `default` or a `not` and becomes an ordinary answer (measured: `default w := "d";
w := "v" if input.q / 0 > 1` is an error in the interpreter and "d" in the VM). No marker shows it. So the VM
answers an entry point only while the modules of its package are, text for text, ones whose agreement with the
interpreter the tests establish over malformed inputs too (`vetted`, by default the shipped rego/:
tests/policy/test_rvm.py), and no other module declares a package overlapping that one or `tf` (a rule there
would shadow what the vetted module reads). Any other uploaded version is still compiled (a refusal is logged)
but answered by the interpreter, exact as before.

Costs and threads. A `Program` and an `Rvm` are bound to the thread that made them (using one from another
thread panics), so each thread keeps its own VM, in the thread's own storage like the interpreter's engines.
Modules are compiled once per modules generation (~6 ms for the shipped policy) and kept as the program's
binary form, which each thread deserialises (~0.1 ms). The VM has no incremental data load: set_data_json
parses the whole document (~25-35 ms at 1,000 tenants x 10 groups x 5,000 grants), once per data generation
per thread, and a thread's VM holds ~10 MB at that scale. So a thread does not reload on every change: while its
VM's data is stale the interpreter answers (which is incremental and exact), and the thread reloads once the
time the interpreter took beyond the VM's in this data generation reaches what its last reload cost (ski rental
per generation: at most about twice what the best choice in hindsight would have cost). A thread whose
generations are usually too short for a reload to pay back waits three reloads' worth, so data changing faster
than that leaves the interpreter answering, as before.
`amortize=False` reloads on the first decision after each change (tests).

Exactness of generations: a thread's VM holds a (modules generation, data generation) pair taken together with
the modules and the data text under the engine's lock; it answers only while both are the engine's current ones.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import regorus

from policy.engines.threadbound import per_thread

log = logging.getLogger(__name__)

HOT_ENTRY_POINTS: tuple[str, ...] = ("data.grants.decision", "data.flows.decision", "data.api_authz.decision")
VM_MODES: tuple[str, ...] = ("auto", "off")
UNDEFINED_MARK = "<undefined>"
COUNTERS = ("vm_answers", "vm_errors", "undefined_values", "not_compiled", "stale_data", "data_loads", "compiles")


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # regorus puts the message after a `--> file:line:col` excerpt; keep the `error:` line when there is one
    for line in lines:
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    return lines[0] if lines else "unknown error"


@dataclass(frozen=True)
class Compiled:
    """One modules generation compiled: the program's binary form (None when nothing compiled), the entry points
    it answers, and why the VM refused each of the others."""

    binary: bytes | None
    entry_points: frozenset[str]
    refused: Mapping[str, str] = field(default_factory=dict)


def compile_program(modules: Mapping[str, str], entry_points: tuple[str, ...] = HOT_ENTRY_POINTS) -> Compiled:
    """Compile `modules` for as many of `entry_points` as the VM accepts together; never raises (a refusal is
    recorded in `refused`, and the interpreter answers those entry points)."""
    sources = sorted((str(path), str(text)) for path, text in modules.items())

    def attempt(eps: list[str]) -> tuple[bytes | None, str | None]:
        error: str | None = None
        try:
            program = regorus.Program.compile_from_modules("{}", sources, eps)
            binary: bytes = bytes(program.serialize_binary())
            return binary, None
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            error = _first_line(str(exc))
        finally:
            program = None  # made and dropped on this thread
        return None, error

    if not entry_points:
        return Compiled(None, frozenset())
    if not sources:
        return Compiled(None, frozenset(), {ep: "no modules" for ep in entry_points})
    binary, error = attempt(list(entry_points))
    if binary is not None:
        return Compiled(binary, frozenset(entry_points))
    refused: dict[str, str] = {}
    accepted: list[str] = []
    for ep in entry_points:  # which ones does it refuse? (an uploaded version may lack a rule or use what the VM lacks)
        one, why = attempt([ep])
        if one is None:
            refused[ep] = why or "refused"
        else:
            accepted.append(ep)
    if accepted:
        binary, error = attempt(accepted)
        if binary is not None:
            return Compiled(binary, frozenset(accepted), refused)
        refused.update({ep: error or "refused together" for ep in accepted})
    return Compiled(None, frozenset(), refused)


DATA_ROOTS: tuple[tuple[str, ...], ...] = (("tf",),)  # the data the vetted modules read (data.tf.*)
_PLAIN = re.compile(r"^data(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")


def packages_of(modules: Mapping[str, str]) -> dict[str, tuple[str, ...] | None]:
    """Each module's package path as regorus's parser reads it ("package a.b" -> ("a", "b")), whatever the text
    around it (indentation, CRLF, a `package` line inside a raw string: a regular expression over the text was
    fooled by each, found in review); None for a module that does not parse or whose path is not plain dotted
    names (`package a["b.c"]`: its parts would be ambiguous)."""
    out: dict[str, tuple[str, ...] | None] = {}
    engine = regorus.Engine()  # made and dropped on this thread
    try:
        for path, text in modules.items():
            try:
                name = str(engine.add_policy(f"vetting/{path}", text))
            except BaseException as exc:
                if _is_fatal(exc):
                    raise
                out[path] = None
                continue
            out[path] = tuple(name.split(".")[1:]) if _PLAIN.match(name) else None
    finally:
        engine = None
    return out


def _related(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def shipped_modules() -> dict[str, str]:
    """The shipped rego/ modules without their tests: what the VM is vetted for by default."""
    from policy.shipped import REGO_DIR

    return {p.name: p.read_text(encoding="utf-8") for p in sorted(REGO_DIR.glob("*.rego"))
            if not p.name.endswith("_test.rego")}


def vetted_entry_points(modules: Mapping[str, str], vetted: Mapping[str, str],
                        entry_points: tuple[str, ...]) -> dict[str, str]:
    """{entry point: why not} for each of `entry_points` the VM may not answer under `modules` (see above)."""
    packages = packages_of(modules)
    vetted_by_pkg: dict[tuple[str, ...], list[str]] = {}
    for path, pkg in packages_of(vetted).items():
        if pkg is not None:
            vetted_by_pkg.setdefault(pkg, []).append(vetted[path])
    out: dict[str, str] = {}
    for ep in entry_points:
        parts = tuple(ep.split("."))
        pkg = parts[1:-1]
        if parts[0] != "data" or not pkg:
            out[ep] = "not a rule path"
            continue
        if None in packages.values():
            out[ep] = "a module does not parse, or its package is not a plain dotted name"
            continue
        own = sorted(text for path, text in modules.items() if packages[path] == pkg)
        if not own or own != sorted(vetted_by_pkg.get(pkg, [])):
            out[ep] = (f"package {'.'.join(pkg)} is not the vetted one (the VM answers only modules tested against "
                       "the interpreter)")
            continue
        for path, other in packages.items():
            assert other is not None
            if other != pkg and any(_related(other, root) for root in (pkg, *DATA_ROOTS)):
                out[ep] = f"{path} (package {'.'.join(other)}) overlaps what package {'.'.join(pkg)} reads"
                break
    return out


class Source(Protocol):
    """What the accelerator reads from the engine it serves (RegorusEngine)."""

    def generations(self) -> tuple[int, int]:
        """(modules generation, data generation) now, read without a lock (a fast check)."""

    def snapshot(self, text: bool) -> tuple[int, Mapping[str, str], int, str]:
        """(modules generation, modules, data generation, the whole data document as JSON text, or "" when
        `text` is False), all of one state, taken under the engine's lock."""


class _ThreadVm:
    """One thread's VM for one accelerator."""

    def __init__(self) -> None:
        self.rvm: Any = None  # regorus.Rvm; None: not built for `modules_gen` (or nothing compiled)
        self.modules_gen = -1
        self.data_gen = -1
        self.entry_points: frozenset[str] = frozenset()
        self.load_seconds = 0.0  # what the last data load (snapshot + set_data_json) cost on this thread
        self.owed = 0.0  # interpreter time beyond the VM's, spent in this data generation
        self.vm_seconds = 0.0  # a VM answer's cost (moving average)
        self.saving = 0.0  # an interpreter answer's cost beyond a VM answer's (moving average)
        self.seen_gen = -1  # the data generation this thread's decisions last saw
        self.gen_decisions = 0  # decisions this thread made in that generation
        self.gen_len: float | None = None  # decisions per data generation on this thread (moving average)
        self.failed: tuple[int, int] | None = None  # the generations whose load failed: not tried again until a change

    def observe(self, data_gen: int) -> None:
        """Count one decision at `data_gen`; a new generation closes the last one's count."""
        if data_gen != self.seen_gen:
            if self.seen_gen != -1:
                n = float(self.gen_decisions)
                self.gen_len = n if self.gen_len is None else 0.7 * self.gen_len + 0.3 * n
            self.seen_gen = data_gen
            self.gen_decisions = 0
            self.owed = 0.0
        self.gen_decisions += 1

    def rent(self) -> bool:
        """Whether the interpreter should answer rather than the VM reload now (its data is stale). Ski rental per
        generation: reload once the interpreter's extra cost in this generation reaches a reload's; when this
        thread's generations are usually too short for a reload to pay back (decisions x saving below twice a
        reload), only at three reloads' worth, so a burst of changes leaves the interpreter answering."""
        worth = self.gen_len is None or self.gen_len * self.saving >= 2 * self.load_seconds
        return self.owed < self.load_seconds * (1 if worth else 3)


_OBSERVERS: list[Callable[[str, int], None]] = []


def observe(observer: Callable[[str, int], None]) -> None:
    """Call `observer(counter, n)` as every accelerator of the process counts (COUNTERS): how the API exports them
    (api/metrics.py) without this package knowing of it. Observers must be cheap and must not raise."""
    if observer not in _OBSERVERS:
        _OBSERVERS.append(observer)


_TLS = threading.local()
_KEYS = itertools.count(1)


class _Registry(dict[int, tuple["weakref.ref[Accelerator]", _ThreadVm]]):
    """One thread's VMs (policy/engines/threadbound.py keeps it alive at exit)."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # identity: one registry per thread

    def __eq__(self, other: object) -> bool:
        return self is other


def _registry() -> _Registry:
    return per_thread(_TLS, "vms", _Registry)


class Accelerator:
    """Answers HOT_ENTRY_POINTS through the compiled VM when that answer is exact; the interpreter otherwise."""

    def __init__(self, entry_points: tuple[str, ...] = HOT_ENTRY_POINTS, *, amortize: bool = True,
                 vetted: Mapping[str, str] | None = None) -> None:
        """`vetted`: the modules the VM may answer for (None: the shipped rego/); `amortize`: see the module."""
        self._vetted = dict(shipped_modules() if vetted is None else vetted)
        self.entry_points = frozenset(entry_points)
        self._order = tuple(entry_points)
        self._amortize = amortize
        self._key = next(_KEYS)
        self._lock = threading.Lock()
        self._compiled: tuple[int, Compiled] | None = None  # (modules generation, its program)
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._closed = False

    def stats(self) -> dict[str, int]:
        """How each decision was answered, and the VM's compiles and data loads (all threads, since creation)."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        """This thread's VM goes now, other threads' when they next look."""
        self._closed = True
        _registry().pop(self._key, None)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n
        for observer in _OBSERVERS:
            observer(name, n)

    def _program(self, modules_gen: int, modules: Mapping[str, str]) -> Compiled:
        with self._lock:
            kept = self._compiled
            if kept is not None and kept[0] == modules_gen:
                return kept[1]
            unvetted = vetted_entry_points(modules, self._vetted, self._order)
            compiled = compile_program(modules, tuple(ep for ep in self._order if ep not in unvetted))
            compiled = Compiled(compiled.binary, compiled.entry_points, {**compiled.refused, **unvetted})
            self._compiled = (modules_gen, compiled)
        self._count("compiles")
        for ep, why in sorted(compiled.refused.items()):
            log.info("rego VM: %s not compiled for this policy (the interpreter answers it): %s", ep, why)
        return compiled

    def _mine(self) -> _ThreadVm:
        registry = _registry()
        entry = registry.get(self._key)
        if entry is None:
            for key in [k for k, (ref, _) in registry.items() if ref() is None or ref()._closed]:  # type: ignore[union-attr]
                del registry[key]  # accelerators gone or closed: their VMs go, on their own thread
            entry = (weakref.ref(self), _ThreadVm())
            registry[self._key] = entry
        return entry[1]

    def _load(self, mine: _ThreadVm, source: Source) -> None:
        """Bring this thread's VM to the engine's current modules and data (raises what regorus raises)."""
        start = time.perf_counter()
        modules_gen, modules, data_gen, text = source.snapshot(True)
        if mine.modules_gen != modules_gen:
            mine.rvm = None
            compiled = self._program(modules_gen, modules)
            mine.entry_points = compiled.entry_points
            mine.modules_gen = modules_gen
            mine.data_gen = -1
            if compiled.binary is not None:
                program, _ = regorus.Program.deserialize_binary(compiled.binary)
                rvm = regorus.Rvm()
                rvm.load_program(program)
                mine.rvm = rvm
        if mine.rvm is not None:
            mine.data_gen = -1  # not usable if set_data_json fails halfway
            mine.rvm.set_data_json(text)
            mine.load_seconds = time.perf_counter() - start
            self._count("data_loads")
        mine.data_gen = data_gen
        mine.owed = 0.0

    def warm(self, source: Source) -> None:
        """Bring this thread's VM up to date now (compile, deserialise, load the data); never raises."""
        if self._closed:
            return
        mine = self._mine()
        if (mine.modules_gen, mine.data_gen) == source.generations():
            return
        try:
            self._load(mine, source)
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            mine.modules_gen = mine.data_gen = -1
            mine.rvm = None
            mine.failed = source.generations()
            log.warning("rego VM: warming failed (the interpreter answers): %s", _first_line(str(exc)))

    def _loaded(self, mine: _ThreadVm, source: Source, gens: tuple[int, int]) -> bool:
        """Load this thread's VM (`_load`); on failure, False (counted, logged) and not tried again at `gens`."""
        try:
            self._load(mine, source)
            return True
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            mine.modules_gen = mine.data_gen = -1
            mine.rvm = None
            mine.failed = gens
            self._count("vm_errors")
            log.warning("rego VM: loading failed (the interpreter answers): %s", _first_line(str(exc)))
            return False

    def evaluate(self, query: str, input_json: str, source: Source, interpret: Callable[[], Any]) -> Any:
        """The value of `query` (one of entry_points) for the input `input_json`: the VM's when exact, else
        `interpret()`'s (whose errors propagate as the engine's)."""
        mine = self._mine()
        gens = source.generations()
        mine.observe(gens[1])
        if mine.failed == gens:  # loading these failed on this thread (a 25-35 ms parse each try): the interpreter
            self._count("vm_errors")
            return interpret()
        if mine.modules_gen != gens[0]:
            if not self._loaded(mine, source, gens):
                return interpret()
        elif mine.data_gen != gens[1] and mine.rvm is not None and query in mine.entry_points:
            if self._amortize and mine.rent():
                start = time.perf_counter()
                value = interpret()
                extra = max(0.0, time.perf_counter() - start - mine.vm_seconds)
                mine.owed += extra
                mine.saving = extra if mine.saving == 0.0 else 0.8 * mine.saving + 0.2 * extra
                self._count("stale_data")
                return value
            if not self._loaded(mine, source, gens):
                return interpret()
        rvm = mine.rvm
        if rvm is None or query not in mine.entry_points:
            self._count("not_compiled")
            return interpret()
        text: str | None = None
        start = time.perf_counter()
        try:
            rvm.set_input_json(input_json)
            text = str(rvm.execute_entry_point(query))
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            log.debug("rego VM: %s raised (the interpreter answers): %s", query, _first_line(str(exc)))
        finally:
            rvm = None
        if text is None:
            self._count("vm_errors")
            return interpret()
        if UNDEFINED_MARK in text:
            self._count("undefined_values")
            return interpret()
        try:
            value = json.loads(text)
        except ValueError:
            self._count("vm_errors")
            return interpret()
        elapsed = time.perf_counter() - start
        mine.vm_seconds = elapsed if mine.vm_seconds == 0.0 else 0.9 * mine.vm_seconds + 0.1 * elapsed
        self._count("vm_answers")
        return value
