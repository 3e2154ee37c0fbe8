"""What a policy version is: a set of Rego modules, its canonical content hash, its optional signature."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from core.canonical import content_hash
from core.errors import InvalidInput
from policy.errors import SignatureRequired

if TYPE_CHECKING:  # cryptography loads where keys are used: `policy validate|test` need none
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    VerifyKey: TypeAlias = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

MAX_MODULE_BYTES = 1_000_000
MAX_MODULES = 200


def version_hash(modules: Mapping[str, str]) -> str:
    """SHA-256 over the canonical JSON of {"modules": {path: text}}: key order never matters."""
    return content_hash({"modules": dict(modules)})


def check_modules(modules: Mapping[str, str]) -> dict[str, str]:
    """The modules, or InvalidInput: at least one, paths ending .rego, no '..', sizes bounded."""
    if not modules:
        raise InvalidInput("a policy version needs at least one .rego module")
    if len(modules) > MAX_MODULES:
        raise InvalidInput(f"a policy version holds at most {MAX_MODULES} modules")
    out: dict[str, str] = {}
    for path, text in modules.items():
        if not isinstance(path, str) or not isinstance(text, str):
            raise InvalidInput("modules map a path to Rego text")
        if not path.endswith(".rego") or path.startswith("/") or ".." in path.split("/"):
            raise InvalidInput(f"module path {path!r} must be a relative path ending in .rego")
        if len(text.encode()) > MAX_MODULE_BYTES:
            raise InvalidInput(f"module {path} is larger than {MAX_MODULE_BYTES} bytes")
        out[path] = text
    return out


def load_dir(directory: Path) -> dict[str, str]:
    """Every *.rego under `directory` (recursively), keyed by its path relative to it."""
    if not directory.is_dir():
        raise InvalidInput(f"{directory} is not a directory")
    modules = {
        p.relative_to(directory).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(directory.rglob("*.rego"))
        if p.is_file()
    }
    if not modules:
        raise InvalidInput(f"no .rego files in {directory}")
    return check_modules(modules)


def load_verify_key(pem: bytes) -> VerifyKey:
    """An Ed25519 or ECDSA public key from PEM; InvalidInput for anything else."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise InvalidInput(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        raise InvalidInput("policy signing keys must be Ed25519 or ECDSA")
    return key


def key_fingerprint(key: VerifyKey) -> str:
    from cryptography.hazmat.primitives import serialization

    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()[:32]


def verify_signature(content_hash_hex: str, signature_b64: str | None, keys: Sequence[VerifyKey]) -> str | None:
    """The fingerprint of the key that signed `content_hash_hex` (its ASCII bytes); None when no key is
    configured (signing off). SignatureRequired when keys are configured and no signature verifies."""
    if not keys:
        return None
    if not signature_b64:
        raise SignatureRequired(
            f"activation requires a security-team signature over the content hash {content_hash_hex}"
        )
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except ValueError as exc:
        raise SignatureRequired("the signature is not valid base64") from exc
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    message = content_hash_hex.encode("ascii")
    for key in keys:
        try:
            if isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, message)
            else:
                key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return key_fingerprint(key)
    raise SignatureRequired(
        f"the signature does not verify over content hash {content_hash_hex} with any configured policy key"
    )


def load_verify_keys(paths: Sequence[Path]) -> list[VerifyKey]:
    """The configured policy signing keys (PEM files). None configured: activation needs no signature."""
    return [load_verify_key(Path(p).read_bytes()) for p in paths]
