"""The table through which replicas share file-store keys (keys/shared.py): each row a key file's bytes, ciphertext
under the trust domain's master key, never a private byte in clear; and the deployment id that marks the keys this
database makes in a PKCS#11 token (keys/deployment.py); the keys this database is about to make there
(keys/intents.py); and the unmarked keys there an upgraded deployment adopted (keys/adoption.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, DateTime, Integer, LargeBinary, String
from sqlmodel import Field, SQLModel


class KeyBlob(SQLModel, table=True):
    __tablename__ = "key_blobs"

    key_id: str = Field(primary_key=True, max_length=128)
    kind: str = Field(max_length=16)
    blob: bytes = Field(sa_column=Column(LargeBinary(), nullable=False))  # the key file, as keys/file.py writes it
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Deployment(SQLModel, table=True):
    """One row (id=1), written once by `init` (keys/deployment.py): the id of the deployment this database is, which
    marks every key it makes in a PKCS#11 token several deployments may share."""

    __tablename__ = "deployment"

    id: int = Field(default=1, sa_column=Column(Integer, primary_key=True, autoincrement=False))
    deployment_id: str = Field(max_length=32)  # 32 lowercase hex digits (128 random bits)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # "init": made with markers from birth, never uses an unmarked key; "upgrade": its keys predate markers, may
    # (keys/deployment.py). Step 18 added it to a table with rows: NULL only in a row written by hand (never adopts).
    origin: str | None = Field(default=None, sa_column=Column(String(16), nullable=True))
    # An `upgrade` deployment's first start of step 19's version recorded the unmarked keys it adopts (adopted_keys)
    # then: from then on it uses only those (keys/adoption.py). NULL: not yet (it uses any), or not an upgrade.
    adopted_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))


class KeyIntent(SQLModel, table=True):
    """A key this database recorded, in a transaction of its own, it was about to make (keys/intents.py): what lets a
    start destroy a CA key no CA row names, and nothing else."""

    __tablename__ = "key_intents"

    key_id: str = Field(primary_key=True, max_length=128)
    deployment_id: str = Field(max_length=32)  # the deployment whose marker the key gets (keys/deployment.py)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class AdoptedKey(SQLModel, table=True):
    """An unmarked key an upgraded deployment adopted (keys/adoption.py): the one public key under this label it
    uses without a marker; any other unmarked key of the label, and of any label not here, it never uses."""

    __tablename__ = "adopted_keys"

    key_id: str = Field(primary_key=True, max_length=128)  # the token label (= key id)
    spki_sha256: str = Field(max_length=64)  # hex SHA-256 of the public key's SubjectPublicKeyInfo DER
    adopted_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
