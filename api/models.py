"""api tables (filled in by the api work)."""

from __future__ import annotations

from sqlmodel import SQLModel

TABLES_V1: list[type[SQLModel]] = []
