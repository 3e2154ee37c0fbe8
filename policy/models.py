"""policy tables (filled in by the policy work)."""

from __future__ import annotations

from sqlmodel import SQLModel

TABLES_V1: list[type[SQLModel]] = []
