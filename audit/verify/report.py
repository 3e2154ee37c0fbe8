"""What a successful verification proved."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class VerifyReport:
    origin: str
    tree_size: int
    root: bytes
    events: int
    gaps: int
    range: tuple[int, int]
    filter: dict[str, Any]
    signed_at: datetime | None = None  # the checkpoint's signed time (None: it carries none)
    cautions: tuple[str, ...] = ()  # proven intact, but a reader should beware (a CSV from before formula guarding)
