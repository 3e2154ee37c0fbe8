"""What an agent's start creates on disk, so a start that fails before the node holds an SVID takes back exactly
that: a join token refused (used, wrong, expired) or a server out of reach left an empty data directory and a
key file behind, which the next start then took for a node's own."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class CreatedPaths:
    """Directories and files the start made itself; `remove` deletes those files and the directories, deepest first,
    each only while empty: never a path that was there before, nor one something else has since put a file in."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.files: list[Path] = []

    def make_dir(self, path: Path, mode: int = 0o777) -> None:
        """Make `path` and its missing ancestors (`mode` for `path` itself), noting only those this call's own mkdir
        made: one there under another spelling (`missing/../kept`) or made meanwhile by someone else is not ours,
        which a look before the mkdir cannot tell. A mkdir that fails otherwise stops here: the caller's own mkdir
        then says why, as before."""
        here = Path(path).absolute()
        for d in [*reversed(here.parents), here]:
            try:
                os.mkdir(d, mode if d == here else 0o777)
            except FileExistsError:
                continue
            except OSError:
                return
            self.dirs.append(d)

    def note_file(self, path: Path) -> None:
        self.files.append(Path(path).absolute())

    def remove(self) -> None:
        for f in self.files:
            with contextlib.suppress(OSError):
                f.unlink()
        for d in reversed(self.dirs):  # (made parents first: the deepest go first)
            with contextlib.suppress(OSError):  # not empty (or gone): left as it is
                d.rmdir()
