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

import logging
import math
import multiprocessing
import pickle
import resource
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from core.errors import TrustfabricError, Unavailable
from policy.errors import PolicyBudgetExceeded, PolicyEngineError

log = logging.getLogger(__name__)

T = TypeVar("T")
# imported once by the fork server, inherited by every job
PRELOAD = ["policy.authoring", "policy.service", "policy.budget"]


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
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(PRELOAD)
        return _context


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

