"""Append-only, tamper-evident audit log. `record` is the only way to append."""

from audit.actor import Actor
from audit.service import record

__all__ = ["Actor", "record"]
