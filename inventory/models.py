"""Inventory tables: tenants (with what the enforcer needs: L3VNI, attachment VLAN, prefixes), groups,
workloads, and the physical fabric (nodes, switches, links) with the placement of each workload."""

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
    # added by schema step 10 (hence last): the attachment VLAN on leaf ports, also the tenant's conntrack
    # zone on every SuperNIC; an IPv6 prefix beside the IPv4 `prefix`
    vlan: int | None = Field(default=None, unique=True, index=True)
    prefix6: str | None = Field(default=None, max_length=64)


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



# --- the physical fabric (the enforcer's inventory; checked as a whole by enforcer.fabric_file) ---------------


class FabricNode(SQLModel, table=True):
    """A GPU node and its BlueField-3 SuperNIC: uplink ports (cabled to leaves) and host-facing ports (VF
    representors, one placed workload each)."""

    __tablename__ = "fabric_nodes"

    name: str = Field(primary_key=True, max_length=63)
    uplinks: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    host_ports: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class FabricSwitch(SQLModel, table=True):
    """A leaf (Spectrum-4 SN5600, Cumulus) or a spine, with its ports."""

    __tablename__ = "fabric_switches"

    name: str = Field(primary_key=True, max_length=63)
    role: str = Field(max_length=8)  # leaf | spine
    ports: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    model: str = Field(default="sn5600", max_length=63)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class FabricLink(SQLModel, table=True):
    """A cable from a leaf port to a node's uplink or to a spine port; each port carries one cable."""

    __tablename__ = "fabric_links"
    __table_args__ = (UniqueConstraint("leaf", "leaf_port"), UniqueConstraint("peer", "peer_port"))

    id: int | None = Field(default=None, primary_key=True)
    leaf: str = Field(max_length=63)
    leaf_port: str = Field(max_length=63)
    peer: str = Field(max_length=63)
    peer_port: str = Field(max_length=63)
    peer_kind: str = Field(max_length=8)  # node | spine
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Placement(SQLModel, table=True):
    """Where a registered workload runs: a node's host port, its addresses (inside its tenant's prefixes),
    and the workload-attestation selectors (`unix:uid:1001`) the node agent matches before it hands the
    workload its SVID. The unique constraints hold one workload per port and one owner per address."""

    __tablename__ = "fabric_placements"
    __table_args__ = (UniqueConstraint("node", "port"),)

    workload: str = Field(primary_key=True, max_length=191)  # tenant/group/name
    tenant: str = Field(max_length=63, index=True)
    node: str = Field(max_length=63, index=True)
    port: str = Field(max_length=63)
    ipv4: str | None = Field(default=None, max_length=15, unique=True)
    ipv6: str | None = Field(default=None, max_length=39, unique=True)
    selectors: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
