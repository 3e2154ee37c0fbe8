"""Encrypted-file key store (the default).

Each key is one file `<key_id>.key`: JSON with a nonce and the AES-256-GCM ciphertext of the PKCS#8 DER.
The master key comes from scrypt over a passphrase (salt stored beside, in `master.salt`) or from a
32-byte key file of mode 0600. The associated data binds key id and kind, so swapping files between
ids fails to decrypt. Files are written 0600 via tmp + link, so a crash never leaves a partial key
and an existing key is never overwritten. No private byte is ever written in plaintext.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from core.files import fsync_dir, write_private_file
from keys.errors import KeyExists, KeyNotFound, KeyStoreError, WrongMasterKey
from keys.store import KeyKind, PrivateKey, PublicKey, Signer, check_key_id, curve_for, hash_for

_FORMAT = "trustfabric-key-v1"
_CHECK_PLAINTEXT = b"trustfabric master key check"
SCRYPT_N = 2**15
SCRYPT_R = 8
SCRYPT_P = 1


class SoftwareSigner:
    """A key held in process memory (decrypted from its file); signs with cryptography."""

    def __init__(self, key_id: str, kind: KeyKind, key: PrivateKey) -> None:
        self._key_id = key_id
        self._kind = kind
        self._key = key

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def kind(self) -> KeyKind:
        return self._kind

    def public_key(self) -> PublicKey:
        return self._key.public_key()

    def sign(self, data: bytes) -> bytes:
        if isinstance(self._key, ed25519.Ed25519PrivateKey):
            return self._key.sign(data)
        algo = hash_for(self._kind)
        assert algo is not None
        return self._key.sign(data, ec.ECDSA(algo))

    def private_key(self) -> PrivateKey:
        return self._key

    def __repr__(self) -> str:  # never show key material
        return f"SoftwareSigner(key_id={self._key_id!r}, kind={self._kind.value})"


def _new_private_key(kind: KeyKind) -> PrivateKey:
    if kind is KeyKind.ED25519:
        return ed25519.Ed25519PrivateKey.generate()
    return ec.generate_private_key(curve_for(kind))


def _write_private_file(path: Path, data: bytes, *, overwrite: bool) -> None:
    """core.files.write_private_file; an existing key file is KeyExists: keys are never overwritten."""
    try:
        write_private_file(path, data, overwrite=overwrite)
    except FileExistsError:
        raise KeyExists(f"key file {path.name} exists already; keys are never overwritten") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class FileKeyStore:
    """Keys as AES-256-GCM encrypted files in one directory (mode 0700)."""

    def __init__(self, directory: Path, master_key: bytes) -> None:
        """Use `FileKeyStore.open`; this constructor trusts that `master_key` was derived properly."""
        if len(master_key) != 32:
            raise KeyStoreError("master key must be 32 bytes")
        self.directory = directory
        self._aead = AESGCM(master_key)
        self._cache: dict[str, SoftwareSigner] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileKeyStore({str(self.directory)!r})"

    @classmethod
    def open(
        cls, directory: Path, *, passphrase: str | None = None, key_file: Path | None = None,
        master_key: bytes | None = None,
    ) -> FileKeyStore:
        """Open (creating when missing) the store; exactly one of passphrase / key_file / master_key (from
        elsewhere: a PKCS#11 token, keys.pkcs11.Pkcs11KeyStore.unwrap_master) unlocks it."""
        if sum(x is not None for x in (passphrase, key_file, master_key)) != 1:
            raise KeyStoreError("give exactly one of passphrase, key_file or master_key to open the key store")
        directory = Path(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by umask and ignored for existing dirs
        if master_key is not None:
            master = master_key
        elif key_file is not None:
            master = cls._read_key_file(Path(key_file))
        else:
            assert passphrase is not None
            if len(passphrase) < 8:
                raise KeyStoreError("the key store passphrase must be at least 8 characters")
            master = cls._derive(directory, passphrase)
        store = cls(directory, master)
        store._check_master()
        return store

    @staticmethod
    def create_key_file(path: Path) -> Path:
        """Write 32 random bytes to a new file, mode 0600 from creation on; an existing file is an error."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyStoreError(f"key file {path} exists already; refusing to overwrite it") from None
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, os.urandom(32))
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    @staticmethod
    def _read_key_file(path: Path) -> bytes:
        try:
            st = path.stat()
        except FileNotFoundError:
            raise KeyStoreError(
                f"key file {path} does not exist; create one with FileKeyStore.create_key_file"
            ) from None
        if not stat.S_ISREG(st.st_mode):
            raise KeyStoreError(f"key file {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyStoreError(
                f"key file {path} has mode {mode:04o}; it must not be readable by group or others "
                f"(chmod 600 {path})"
            )
        data = path.read_bytes()
        if len(data) != 32:
            raise KeyStoreError(f"key file {path} must hold exactly 32 bytes, found {len(data)}")
        return data

    @staticmethod
    def _derive(directory: Path, passphrase: str) -> bytes:
        salt_path = directory / "master.salt"
        if not salt_path.exists():
            with contextlib.suppress(KeyExists):
                _write_private_file(salt_path, os.urandom(16), overwrite=False)
        salt = salt_path.read_bytes()
        if len(salt) < 16:
            raise KeyStoreError(f"{salt_path} is damaged (salt shorter than 16 bytes)")
        kdf = Scrypt(salt=salt, length=32, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
        return kdf.derive(passphrase.encode())

    def _check_master(self) -> None:
        """A wrong passphrase or key file fails here, at open, not at the first signature."""
        check = self.directory / "master.check"
        if not check.exists():
            nonce = os.urandom(12)
            blob = nonce + self._aead.encrypt(nonce, _CHECK_PLAINTEXT, b"master-check")
            with contextlib.suppress(KeyExists):
                _write_private_file(check, blob, overwrite=False)
        blob = check.read_bytes()
        try:
            self._aead.decrypt(blob[:12], blob[12:], b"master-check")
        except InvalidTag:
            raise KeyStoreError(
                f"wrong passphrase or key file for the key store in {self.directory}"
            ) from None

    def _path(self, key_id: str) -> Path:
        return self.directory / f"{check_key_id(key_id)}.key"

    @staticmethod
    def _ad(key_id: str, kind: KeyKind) -> bytes:
        return f"{_FORMAT}\0{key_id}\0{kind.value}".encode()

    def generate(self, key_id: str, kind: KeyKind) -> Signer:
        """Create a key; an existing key_id is KeyExists, never overwritten silently."""
        kind = KeyKind(kind)
        path = self._path(key_id)
        if path.exists():
            raise KeyExists(f"key {key_id!r} exists already; keys are never overwritten")
        key = _new_private_key(kind)
        der = key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        nonce = os.urandom(12)
        doc = {
            "format": _FORMAT,
            "key_id": key_id,
            "kind": kind.value,
            "nonce": _b64(nonce),
            "ciphertext": _b64(self._aead.encrypt(nonce, der, self._ad(key_id, kind))),
        }
        _write_private_file(path, json.dumps(doc, sort_keys=True).encode(), overwrite=False)
        signer = SoftwareSigner(key_id, kind, key)
        with self._lock:
            self._cache[key_id] = signer
        return signer

    def get(self, key_id: str) -> Signer:
        """The key, or KeyNotFound."""
        with self._lock:
            cached = self._cache.get(key_id)
        if cached is not None:
            return cached
        signer = self._decode(key_id, self.blob(key_id), f"key file {self._path(key_id).name}")
        with self._lock:
            self._cache[key_id] = signer
        return signer

    def blob(self, key_id: str) -> bytes:
        """The key file's bytes as they are (ciphertext under the master key, key id and kind bound as associated
        data), or KeyNotFound: what keys/shared.py publishes for the other replicas."""
        try:
            return self._path(key_id).read_bytes()
        except FileNotFoundError:
            raise KeyNotFound(f"no key {key_id!r} in the key store at {self.directory}") from None

    def adopt(self, key_id: str, blob: bytes, *, source: str) -> Signer:
        """Hold `blob` (a key file's bytes from `source`, another replica's key) as the file of key_id, once it
        decrypts under this store's master key (else WrongMasterKey, nothing written). Written 0600 via tmp + link;
        a file of that id already here with other bytes is KeyExists (a key is never overwritten)."""
        signer = self._decode(key_id, blob, f"key {key_id!r} from {source}", foreign=True)
        path = self._path(key_id)
        try:
            write_private_file(path, blob, overwrite=False)
        except FileExistsError:
            if path.read_bytes() != blob:
                raise KeyExists(f"key {key_id!r} from {source} differs from the key file {path.name} in "
                                f"{self.directory}; keys are never overwritten") from None
        with self._lock:
            self._cache.setdefault(key_id, signer)
        return signer

    def _decode(self, key_id: str, blob: bytes, what: str, *, foreign: bool = False) -> SoftwareSigner:
        """The key a file's bytes hold; `what` names them in errors. A blob from elsewhere (`foreign`) that fails
        authentication was made under another master key: WrongMasterKey, not a damaged file."""
        try:
            doc = json.loads(blob)
        except ValueError:
            raise KeyStoreError(f"{what} is damaged (not JSON)") from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("key_id") != key_id:
            raise KeyStoreError(f"{what} does not hold key {key_id!r}")
        try:
            kind = KeyKind(doc["kind"])
            nonce, ciphertext = base64.b64decode(doc["nonce"]), base64.b64decode(doc["ciphertext"])
        except (KeyError, ValueError, TypeError):
            raise KeyStoreError(f"{what} does not decrypt: damaged or swapped") from None
        try:
            der = self._aead.decrypt(nonce, ciphertext, self._ad(key_id, kind))
        except InvalidTag:
            if foreign:
                raise WrongMasterKey(
                    f"{what} does not decrypt under the master key of the key store at {self.directory}: it was made "
                    "under another master key; give this data directory the trust domain's master key file (or "
                    "passphrase and keys/master.salt)") from None
            raise KeyStoreError(f"{what} does not decrypt: damaged or swapped") from None
        loaded = serialization.load_der_private_key(der, password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
            raise KeyStoreError(f"{what} holds an unsupported key type")
        return SoftwareSigner(key_id, kind, loaded)

    def exists(self, key_id: str) -> bool:
        """Whether a key with this id is held."""
        return self._path(key_id).exists()

    def key_ids(self) -> list[str]:
        """The ids of the key files held, sorted (a name that is no key id, a stray file, is not one)."""
        ids = []
        for path in self.directory.glob("*.key"):
            key_id = path.name.removesuffix(".key")
            with contextlib.suppress(KeyStoreError):
                ids.append(check_key_id(key_id))
        return sorted(ids)

    def delete(self, key_id: str) -> None:
        """Destroy the key; KeyNotFound when there is none."""
        path = self._path(key_id)
        with self._lock:
            self._cache.pop(key_id, None)
        try:
            path.unlink()
        except FileNotFoundError:
            raise KeyNotFound(f"no key {key_id!r} in the key store at {self.directory}") from None
        fsync_dir(self.directory)
