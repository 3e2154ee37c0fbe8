"""Files that hold secrets: written whole or not at all, never readable by anyone else for an instant."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_private_file(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write `data` to `path` with mode 0600 atomically: tmp file (0600 from birth), fsync, link/rename.
    Without `overwrite` an existing `path` is FileExistsError (link fails even when two writers race)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
