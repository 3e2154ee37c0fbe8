"""Pause points for crash tests: a test stops a real process at a named step of its work, deterministically,
and kills it there (`kill -9` between two steps of an apply) instead of guessing the moment with sleeps.

Inert unless the environment holds `TRUSTFABRIC_TEST_PAUSE=<point>=<ready file>`: the first time the process
reaches `<point>` it writes its pid to the ready file (atomically: the test sees the whole file or none) and
waits there, at most PAUSE_LIMIT seconds (a forgotten variable delays, never hangs, a process), for the kill.
Points in the code: `ovs.apply.before-commit` (the OVS backend wrote the flow file, the bundle is not
committed), `agent.apply.unrecorded` (the device runs the new set; the agent has neither recorded nor
reported it).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

ENV = "TRUSTFABRIC_TEST_PAUSE"
PAUSE_LIMIT = 60.0

_paused: set[str] = set()
_lock = threading.Lock()


def pause_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, ready = spec.partition("=")
    if point != name or not ready:
        return
    with _lock:
        if name in _paused:
            return
        _paused.add(name)
    path = Path(ready)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{os.getpid()}\n", encoding="utf-8")
    os.replace(tmp, path)
    threading.Event().wait(PAUSE_LIMIT)
