"""The table through which replicas share file-store keys (keys/shared.py): each row a key file's bytes, ciphertext
under the trust domain's master key, never a private byte in clear."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, DateTime, LargeBinary
from sqlmodel import Field, SQLModel


class KeyBlob(SQLModel, table=True):
    __tablename__ = "key_blobs"

    key_id: str = Field(primary_key=True, max_length=128)
    kind: str = Field(max_length=16)
    blob: bytes = Field(sa_column=Column(LargeBinary(), nullable=False))  # the key file, as keys/file.py writes it
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
