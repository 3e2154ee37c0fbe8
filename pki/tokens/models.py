"""API credentials. Only hashes of bearer secrets are stored; the secret is shown once."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, DateTime
from sqlmodel import Field, SQLModel


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_tokens"

    id: str = Field(primary_key=True, max_length=64)  # opaque id, also the JWT `jti` for JWT tokens
    token_hash: str | None = Field(default=None, max_length=64, unique=True)  # sha256 of an opaque secret
    role: str = Field(max_length=32)
    tenant: str | None = Field(default=None, max_length=63)
    subject: str = Field(max_length=512)
    description: str = Field(default="", max_length=200)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    expires_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    revoked_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))

