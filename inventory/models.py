"""Inventory tables. Tenants carry what the enforcer needs later (L3VNI, address prefix)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, UniqueConstraint
from sqlmodel import Field, SQLModel


class Tenant(SQLModel, table=True):
    __tablename__ = "tenants"

    slug: str = Field(primary_key=True, max_length=63)
    display_name: str = Field(max_length=200)
    l3vni: int | None = Field(default=None, unique=True)
    prefix: str | None = Field(default=None, max_length=64)  # CIDR the enforcer allocates from
    quarantined: bool = Field(default=False)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class WorkloadGroup(SQLModel, table=True):
    __tablename__ = "workload_groups"
    __table_args__ = (UniqueConstraint("tenant", "name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant: str = Field(foreign_key="tenants.slug", max_length=63, index=True)
    name: str = Field(max_length=63)
    labels: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    # [{"proto": "tcp", "port": 443}, ...]: what other groups may reach on this group
    ports: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    sensitivity: str = Field(default="normal", max_length=16)  # normal | sensitive
    quarantined: bool = Field(default=False)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Workload(SQLModel, table=True):
    __tablename__ = "workloads"
    __table_args__ = (UniqueConstraint("tenant", "group", "name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant: str = Field(foreign_key="tenants.slug", max_length=63, index=True)
    group: str = Field(max_length=63)
    name: str = Field(max_length=63)
    spiffe_id: str = Field(max_length=2048, unique=True)
    revoked: bool = Field(default=False)  # identities revoked by security: flows withdrawn
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))

