"""Run user-supplied Rego (validate, test, upload, impact, the activation check) in a separate process with
a CPU-time and a memory limit (issue 13, item 5).

regorus holds the interpreter lock for a whole evaluation and cannot be interrupted: a comprehension over a
few million elements ran 3.5-7 s in the server process, and every other request waited. Here each job is a
process forked from a small, clean server process (multiprocessing's forkserver, which has the policy code
preloaded: ~10-30 ms a job instead of an interpreter start), limited with setrlimit before it runs:
RLIMIT_CPU (the kernel ends it past the CPU budget) and RLIMIT_AS (its address space may grow by the memory
limit, no more). The caller's thread only waits on a pipe, with a wall-clock bound on top, so the server
keeps answering. At most `workers` jobs run at once per server process; one more waits its turn for up to
the CPU budget, then is refused (503).
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import os
import pickle
import resource
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import forkserver, spawn
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from core.errors import TrustfabricError, Unavailable
from policy.errors import PolicyBudgetExceeded, PolicyEngineError

log = logging.getLogger(__name__)

T = TypeVar("T")
# Imported once by the fork server, inherited by every job. "policy.sandbox": each job unpickles `_child` from
# it, and importing it there preloads the parent's main script (_preload_parent_main). "__main__" asks
# CPython 3.13+ to do that itself.
PRELOAD = ["policy.sandbox", "__main__", "policy.authoring", "policy.service", "policy.budget"]
_MAIN_ENV = "TRUSTFABRIC_SANDBOX_MAIN"  # the parent's main script, handed to the fork server at its start


@dataclass(frozen=True)
class Limits:
    cpu_seconds: float = 5.0  # CPU time one job may use (whole seconds: the kernel's granularity)
    memory_mb: int = 1024  # how much one job's address space may grow beyond the fork server's
    workers: int = 2  # jobs at once per server process

    @property
    def cpu_whole_seconds(self) -> int:
        return max(1, math.ceil(self.cpu_seconds))


_context_lock = threading.Lock()
_context: Any = None
_slots: dict[int, threading.BoundedSemaphore] = {}


def _mp() -> Any:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _start_fork_server()
            _context = context
        return _context


def _start_fork_server() -> None:
    """Start the fork server, telling it the main script a job would otherwise re-run (see below)."""
    os.environ[_MAIN_ENV] = str(spawn.get_preparation_data("policy-job").get("init_main_from_path") or "")
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(_MAIN_ENV, None)


def _prepare_fork_server() -> None:
    """In the fork server (which imports this module first, PRELOAD; nowhere else): preload the parent's main
    script, then warm up: run the shipped policies' tests once, so every job starts from interpreter code
    already specialised and allocator memory already mapped instead of paying that cold start again
    (measured: a job used ~40 ms more CPU than the same work in a warm process)."""
    if _MAIN_ENV not in os.environ:
        return
    try:
        _preload_parent_main(os.environ.pop(_MAIN_ENV))
    except Exception:  # jobs then run it themselves, as before
        log.warning("the fork server could not preload the main script", exc_info=True)
    try:
        from policy import authoring
        from policy.shipped import REGO_DIR
        from policy.versions import load_dir

        authoring.test(load_dir(REGO_DIR))
    except Exception:  # a warm-up only: the jobs report their own errors
        log.debug("policy job warm-up failed", exc_info=True)


def _preload_parent_main(path: str) -> None:
    """Run the parent's main script once, so jobs skip it.

    Before it starts, every forked job re-runs the parent's main script (multiprocessing's main-module fixup,
    for functions defined there). In the server that script is the `trustfabric` entry point, which imports
    the whole CLI and API: ~100 ms a job, twice what the sandbox may add (issue 13, item 5). "__main__" in
    the preload list is meant to run it once in the fork server, but before CPython 3.13 that never happened
    (python/cpython#126631); this does what the fixed version does. Run as `__mp_main__`, so a guarded
    `if __name__ == "__main__"` block stays unrun, as multiprocessing requires anyway."""
    if not path or getattr(sys.modules.get("__main__"), "__file__", None) is not None:
        return  # no main script, or it is in place already (3.13+)
    process = multiprocessing.current_process()
    process._inheriting = True  # type: ignore[attr-defined]  # as multiprocessing marks its own fixup
    try:
        spawn.import_main_path(path)
    finally:
        del process._inheriting  # type: ignore[attr-defined]



def _slot(workers: int) -> threading.BoundedSemaphore:
    with _context_lock:
        return _slots.setdefault(workers, threading.BoundedSemaphore(max(1, workers)))


def _address_space() -> int:
    """This process's current virtual size in bytes (VmSize)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...], cpu: int, memory: int) -> None:
    """The job process: limit itself, run `fn`, send ("ok", value) | ("error", exception) | ("memory",)."""
    # What the fork server holds (the preloaded CLI and API: ~600 modules) is never garbage here; left to the
    # collector, every full collection walks it and writes to its pages, copying them from the fork server:
    # measured +150-300 ms on the shipped policies' tests. Frozen, the job's collections see only its own.
    gc.freeze()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the budget, SIGKILL a second later
    limit = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        conn.send(("ok", fn(*args)))
    except MemoryError:
        conn.send(("memory",))
    except TrustfabricError as exc:
        try:
            pickle.loads(pickle.dumps(exc))  # noqa: S301 (our own exception, made in this process: can it cross?)
            conn.send(("error", exc))
        except Exception:
            conn.send(("error", PolicyEngineError(str(exc))))
    except Exception as exc:
        conn.send(("error", PolicyEngineError(f"the policy job failed: {type(exc).__name__}: {exc}"[:2000])))
    finally:
        conn.close()


def run_limited(fn: Callable[..., T], *args: Any, limits: Limits, what: str) -> T:
    """`fn(*args)` in a limited job process: its value, or the exception it raised (a TrustfabricError);
    PolicyBudgetExceeded (422) naming `what` and the budget when the job goes over its CPU or memory
    limit; Unavailable (503) when every job slot stays busy. `fn` and its arguments must be picklable
    (module-level functions and plain data)."""
    slot = _slot(limits.workers)
    if not slot.acquire(timeout=limits.cpu_seconds):
        raise Unavailable(f"every policy evaluation worker is busy; retry {what} shortly")
    try:
        return _run(fn, args, limits, what)
    finally:
        slot.release()


def _run(fn: Callable[..., T], args: tuple[Any, ...], limits: Limits, what: str) -> T:
    ctx = _mp()
    receiver, sender = ctx.Pipe(duplex=False)
    cpu = limits.cpu_whole_seconds
    process = ctx.Process(target=_child, args=(sender, fn, args, cpu, limits.memory_mb * 1024 * 1024), daemon=True)
    process.start()
    sender.close()
    wall = cpu * 3 + 5  # CPU time is the budget; this only ends a job that waits instead of working
    message: tuple[Any, ...] | None = None
    try:
        if receiver.poll(wall):
            try:
                message = receiver.recv()
            except EOFError:
                message = None  # the job died before it answered
    finally:
        receiver.close()
        if message is None and process.is_alive():
            process.kill()
        process.join(timeout=10)
    cpu_text = f"the {limits.cpu_seconds:g} s CPU budget"
    memory_text = f"the {limits.memory_mb} MiB memory limit"
    if message is None:
        code = process.exitcode
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            raise PolicyBudgetExceeded(f"{what} exceeded {cpu_text}")
        if code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS):
            raise PolicyBudgetExceeded(f"{what} exceeded {memory_text}")  # an allocation the limit refused
        raise PolicyBudgetExceeded(f"{what} did not finish within {wall} s (exit {code})")
    if message[0] == "ok":
        value: T = message[1]
        return value
    if message[0] == "memory":
        raise PolicyBudgetExceeded(f"{what} exceeded {memory_text}")
    raise message[1]


_prepare_fork_server()  # last: the main script it runs may import this module's names
