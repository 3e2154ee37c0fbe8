"""Progress of a long benchmark: one line a step on stderr with the time elapsed, so a person watching
`make bench` sees it move while the figures stay alone on stdout."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, name: str) -> None:
        self.name = name
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        sys.stderr.write(f"[{self.name} {time.monotonic() - self.start:6.1f}s] {what}\n")
        sys.stderr.flush()

    def done(self) -> None:
        self.step("done")
