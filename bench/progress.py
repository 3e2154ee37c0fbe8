"""Progress of a long benchmark on stderr (figures stay alone on stdout): one line a step with the time
elapsed, rewritten in place on a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, name: str) -> None:
        self.name = name
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, what: str) -> None:
        line = f"[{self.name} {time.monotonic() - self.start:6.1f}s] {what}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
