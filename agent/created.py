"""What an agent's start creates on disk, so a start that fails before the node holds an SVID takes back exactly
that: a join token refused (used, wrong, expired) or a server out of reach left an empty data directory and a
key file behind, which the next start then took for a node's own (a key file beside no node key)."""

from __future__ import annotations

import contextlib
from pathlib import Path


class CreatedPaths:
    """Directories missing before the start (noted before anything is made) and files the start made; `remove`
    deletes those files and the directories, deepest first, each only while empty: never a path that was there
    before, nor one something else has since put a file in."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.files: list[Path] = []

    def note_dir(self, path: Path) -> None:
        """`path` and each of its ancestors that does not exist yet: the directories `mkdir(parents=True)` makes."""
        here = Path(path).absolute()
        while not here.exists() and here != here.parent:
            self.dirs.append(here)
            here = here.parent

    def note_file(self, path: Path) -> None:
        self.files.append(Path(path).absolute())

    def remove(self) -> None:
        for f in self.files:
            with contextlib.suppress(OSError):
                f.unlink()
        for d in sorted(set(self.dirs), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):  # not empty (or gone): left as it is
                d.rmdir()
