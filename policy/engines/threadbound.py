"""Per-thread storage for regorus objects, which are bound to the thread that made them (pyo3 `unsendable`:
using or dropping one on another thread panics or is refused).

A thread that ends drops what it holds itself (its thread-local storage goes with it). Threads still running
when the interpreter exits (daemon threads: server and worker pools) are not joined: their storage would be torn
down from the exiting thread, where dropping a regorus object is refused ("Engine is unsendable, but is being
dropped on another thread"). The process is ending, so what they hold is simply kept: one reference more, never
released, and nothing is dropped. The interpreter's engines (embedded.py) and the compiled VMs (rvm.py) share it.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def per_thread(tls: threading.local, name: str, factory: Callable[[], T]) -> T:
    """This thread's `tls.<name>`, made by `factory` on first use. The object must be weak-referenceable and hash
    by identity (it is tracked for the exit hook below)."""
    held: T | None = getattr(tls, name, None)
    if held is None:
        held = factory()
        setattr(tls, name, held)
        _LIVE.add(held)
    return held


@atexit.register
def _keep_what_running_threads_hold_at_exit() -> None:
    for held in list(_LIVE):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
