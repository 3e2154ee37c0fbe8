"""pki tables (filled in by the pki work)."""

from __future__ import annotations

from sqlmodel import SQLModel

TABLES_V1: list[type[SQLModel]] = []
