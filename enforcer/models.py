"""The enforcer's tables: versioned rule sets per device, and each device's state (what it should run,
what it reports it runs). The pure modules (compiler, renderers, equivalence, plan) never import this."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


class RuleSetVersion(SQLModel, table=True):
    """One published rule set of one device: its canonical IR (RFC 8785 text, exactly what is hashed), the
    content hash, why it was published and by whom. Versions of a device count up from 1 and never change;
    the device's desired rule set is its highest version."""

    __tablename__ = "enforcer_rulesets"
    __table_args__ = (UniqueConstraint("device", "version"),)

    id: int | None = Field(default=None, primary_key=True)  # publication order across devices
    device: str = Field(max_length=80, index=True)  # nic:<node> | leaf:<name>
    version: int
    content_hash: str = Field(max_length=64)
    ir: str = Field(sa_column=Column(Text, nullable=False))
    cause: str = Field(max_length=500)
    published_by: str = Field(max_length=512)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class DeviceState(SQLModel, table=True):
    """A device's desired version (the latest published; `pinned` by a rollback: automatic publication
    leaves it alone), what a fresh compile would publish when that is held back (`pending_hash`: manual
    mode or a pin), and the latest status its agent reported (applied version and hash, per-rule counters,
    drift, last error)."""

    __tablename__ = "enforcer_devices"

    device: str = Field(primary_key=True, max_length=80)
    kind: str = Field(max_length=8)  # nic | leaf
    in_fabric: bool = Field(default=True)  # False once its node or leaf left the fabric
    version: int = Field(default=0)  # desired = latest published version; 0: none yet
    content_hash: str | None = Field(default=None, max_length=64)
    pinned: bool = Field(default=False)
    pending_hash: str | None = Field(default=None, max_length=64)
    applied_version: int | None = Field(default=None)
    applied_hash: str | None = Field(default=None, max_length=64)
    applied_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    drift: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    drift_repaired: bool = Field(default=False)
    last_error: str | None = Field(default=None, max_length=2000)
    counters: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    reported_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # the highest `report_seq` an agent numbered a stored report with (schema step 20): a report numbered at or
    # below it is older than what is stored and changes nothing; NULL until an agent that numbers them reports
    report_seq: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
