"""Key store protocol (SPIRE KeyManager style): CA, JWT, audit-checkpoint and API-issuer keys live here.

Two implementations: `keys.file.FileKeyStore` (AES-256-GCM encrypted files, default) and
`keys.pkcs11.Pkcs11KeyStore` (keys generated and used inside a PKCS#11 token).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from typing import Protocol, runtime_checkable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from keys.errors import KeyStoreError

PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey

_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")


class KeyKind(str, Enum):  # noqa: UP042 (the value is what is stored and shown)
    EC_P256 = "ec-p256"
    EC_P384 = "ec-p384"
    ED25519 = "ed25519"


@runtime_checkable
class Signer(Protocol):
    """One key held by a KeyStore; signs without exposing the private key material."""

    @property
    def key_id(self) -> str:
        """The id the key was generated under."""
        ...

    @property
    def kind(self) -> KeyKind:
        """Curve / algorithm of the key."""
        ...

    def public_key(self) -> PublicKey:
        """The public half, safe to publish."""
        ...

    def sign(self, data: bytes) -> bytes:
        """DER ECDSA over SHA-256 (P-256) / SHA-384 (P-384), or the raw 64-byte Ed25519 signature."""
        ...

    def private_key(self) -> PrivateKey:
        """A key object for CertificateBuilder.sign / pyjwt; never serialise it (PKCS#11 keys cannot be)."""
        ...


class KeyStore(Protocol):
    """Holds CA and signing keys; private key material never leaves it unencrypted."""

    def generate(self, key_id: str, kind: KeyKind) -> Signer:
        """Create a key; an existing key_id is KeyExists, never overwritten silently."""
        ...

    def get(self, key_id: str) -> Signer:
        """The key, or KeyNotFound."""
        ...

    def exists(self, key_id: str) -> bool:
        """Whether a key with this id is held."""
        ...

    def delete(self, key_id: str) -> None:
        """Destroy the key; KeyNotFound when there is none."""
        ...


@runtime_checkable
class MarkedKeyStore(Protocol):
    """A key store several deployments may share (a PKCS#11 token), whose generate marks each key with the deployment
    that made it (keys/deployment.py), so that a deployment removes its own unused keys and never another's."""

    def key_owners(self) -> dict[str, str | None]:
        """Every private key held, by key id, with the deployment id the marker of the key this deployment would use
        under that id names (its own, else an unmarked one); None: no marker (made before markers existed, or by
        other software). An id only other deployments' keys carry names one of them."""
        ...

    def committed_ids(self) -> set[str]:
        """The ids of this deployment's keys the store says a committed CA row named (mark_committed ran): the
        witness a database backup cannot roll back."""
        ...

    def mark_committed(self, key_id: str) -> bool:
        """Record in the store that a committed CA row names this deployment's key `key_id`; whether anything
        changed (False: marked already, or not this deployment's key). Only after that commit."""
        ...

    def adopts_unmarked(self) -> bool:
        """Whether lookups may take any unmarked key (a deployment whose keys predate markers, until it recorded the
        unmarked keys it adopts); never for one made with markers."""
        ...

    def unmarked_in_use(self) -> set[str]:
        """The key ids whose key this deployment uses is an unmarked one (adopted, or any before adoption)."""
        ...

    def adoptable(self, key_ids: Iterable[str]) -> dict[str, str]:
        """Of `key_ids`, those this deployment has no marked key of and exactly one unmarked key of, each with the
        hex SHA-256 of its public key's SubjectPublicKeyInfo DER; KeyStoreError naming labels with several."""
        ...

    def destroy_marked(self, key_id: str, deployment_id: str) -> bool:
        """Destroy key `key_id` (private and public object) if it is marked as made by `deployment_id` and not marked
        committed; whether it was. A key of another deployment, unmarked, or committed, is left as it is (False)."""
        ...


def check_key_id(key_id: str) -> str:
    """Key ids become file names and token labels: 1-128 chars of [A-Za-z0-9._-], no leading '.'."""
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise KeyStoreError(f"key id {key_id!r:.80} must be 1-128 chars of A-Z a-z 0-9 . _ - (no leading '.')")
    return key_id


def hash_for(kind: KeyKind) -> hashes.HashAlgorithm | None:
    """The hash a certificate or CRL signed by this key uses (None: Ed25519 hashes internally)."""
    if kind is KeyKind.EC_P256:
        return hashes.SHA256()
    if kind is KeyKind.EC_P384:
        return hashes.SHA384()
    return None


def jwt_alg(kind: KeyKind) -> str:
    """The JWS alg for a key kind."""
    return {KeyKind.EC_P256: "ES256", KeyKind.EC_P384: "ES384", KeyKind.ED25519: "EdDSA"}[kind]


def curve_for(kind: KeyKind) -> ec.EllipticCurve:
    if kind is KeyKind.EC_P256:
        return ec.SECP256R1()
    if kind is KeyKind.EC_P384:
        return ec.SECP384R1()
    raise ValueError(f"{kind.value} is not an elliptic-curve (ECDSA) kind")


def kind_of_public_key(key: object) -> KeyKind:
    """The KeyKind of a public key, or KeyStoreError for kinds the project does not use."""
    if isinstance(key, ed25519.Ed25519PublicKey):
        return KeyKind.ED25519
    if isinstance(key, ec.EllipticCurvePublicKey):
        if isinstance(key.curve, ec.SECP256R1):
            return KeyKind.EC_P256
        if isinstance(key.curve, ec.SECP384R1):
            return KeyKind.EC_P384
    raise KeyStoreError(f"unsupported key type {type(key).__name__}")
