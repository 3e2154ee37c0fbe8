"""The agent's secret for what it keeps on disk: private keys are never stored unencrypted (DESIGN.md).

One 32-byte random secret in a key file (mode 0600, 32 raw bytes: the server's FileKeyStore key-file format)
encrypts the node key (encrypted PKCS#8 in node.pem, which ssl's load_cert_chain opens with the password
derived here) and the workload SVID cache (AES-256-GCM, the associated data naming node and purpose, so a
file moved to another node or purpose does not open).

Where the key file lives decides what the encryption protects against. Default: beside the data directory,
not in it (`<data dir>.key`), created on first start; then a copy of the data directory (a backup, a support
bundle, a disk image of /var/lib) carries no usable key. Better, on a real node: a systemd credential
(`LoadCredentialEncrypted=` sealed to the node's TPM, decrypted into the service's private tmpfs), which the
agent reads from `$CREDENTIALS_DIRECTORY/trustfabric-agent.key` when systemd provides it, or any path given
with `--key-file`. Root on the running node reads the key either way, as it could read the process memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.errors import TrustfabricError
from core.files import write_private_file

KEY_BYTES = 32
CREDENTIAL = "trustfabric-agent.key"
_SEALED = b"tf-agent-sealed-v1\n"


class AtRestError(TrustfabricError):
    """The key file is missing, unsafe or wrong, or a sealed file does not open with it."""


def default_key_file(data_dir: Path) -> Path:
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and (Path(creds) / CREDENTIAL).exists():
        return Path(creds) / CREDENTIAL
    data_dir = Path(data_dir).absolute()
    return data_dir.with_name(f"{data_dir.name}.key")


class AtRest:
    def __init__(self, secret: bytes, node: str) -> None:
        if len(secret) != KEY_BYTES:
            raise AtRestError(f"the agent key must be {KEY_BYTES} bytes")
        self._secret = secret
        self.node = node
        self.created = False  # `open` made the key file (a first start): agent/created.py takes it back on failure

    def __repr__(self) -> str:  # never show the secret
        return f"AtRest(node={self.node!r})"

    @classmethod
    def open(cls, key_file: Path, node: str, *, create: bool) -> AtRest:
        """The key file's secret; with `create` a missing file is made (0600, never overwriting one)."""
        path = Path(key_file)
        created = False
        if not path.exists():
            if not create:
                raise AtRestError(f"the agent key file {path} is missing: the node key in the data directory cannot "
                                  "be opened without it (restore it, or start over with a new data directory and "
                                  "join token)")
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another start made it first: use that one
                write_private_file(path, os.urandom(KEY_BYTES), overwrite=False)
                created = True
        try:
            st = path.stat()
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise AtRestError(f"the agent key file {path} is readable by others (mode "
                                  f"{stat.S_IMODE(st.st_mode):o}): chmod 600 it")
            secret = path.read_bytes()
        except OSError as exc:
            raise AtRestError(f"the agent key file {path}: {exc.strerror}") from None
        if len(secret) != KEY_BYTES:
            raise AtRestError(f"the agent key file {path} must hold {KEY_BYTES} bytes, not {len(secret)}")
        opened = cls(secret, node)
        opened.created = created
        return opened

    def _derive(self, purpose: str) -> bytes:
        return hmac.new(self._secret, f"trustfabric-agent:{self.node}:{purpose}".encode(), hashlib.sha256).digest()

    def password(self) -> bytes:
        """The node key's PKCS#8 password (hex text: OpenSSL's password callbacks take no NUL bytes)."""
        return self._derive("node-key").hex().encode()

    def seal(self, data: bytes, purpose: str) -> bytes:
        nonce = os.urandom(12)
        return _SEALED + nonce + AESGCM(self._derive(purpose)).encrypt(nonce, data, purpose.encode())

    def unseal(self, blob: bytes, purpose: str) -> bytes:
        if not blob.startswith(_SEALED) or len(blob) < len(_SEALED) + 12 + 16:
            raise AtRestError(f"not a sealed {purpose} file")
        body = blob[len(_SEALED):]
        try:
            return AESGCM(self._derive(purpose)).decrypt(body[:12], body[12:], purpose.encode())
        except InvalidTag:
            raise AtRestError(f"the sealed {purpose} file does not open with this agent key (another key file, "
                              "another node, or altered)") from None
