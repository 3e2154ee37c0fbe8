"""The KeyStore contract (SPIRE keymanagertest style): every test taking `store` runs against every
implementation in keys/ -- encrypted files, the same shared through real SQLite and PostgreSQL, and a real SoftHSM2
token. A new implementation joins by
adding one entry to IMPLEMENTATIONS; test_every_implementation_is_conformance_tested fails until it does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from keys.errors import KeyExists, KeyNotFound, KeyStoreError
from keys.file import FileKeyStore
from keys.pkcs11 import Pkcs11KeyStore
from keys.shared import SharedKeyStore
from keys.store import KeyKind, KeyStore, Signer, hash_for, jwt_alg
from store.db import Database
from tests.keys.stores import PIN, softhsm_token


def _file_store(tmp_path: Path, _request: pytest.FixtureRequest) -> Iterator[KeyStore]:
    yield FileKeyStore.open(tmp_path / "keys", key_file=FileKeyStore.create_key_file(tmp_path / "k"))


def _shared_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KeyStore]:
    """A file store sharing its keys through a real database: SQLite, and PostgreSQL (`shared_db` says which)."""
    db: Database = request.getfixturevalue(request.param[1])
    files = FileKeyStore.open(tmp_path / "keys", key_file=FileKeyStore.create_key_file(tmp_path / "k"))
    yield SharedKeyStore(files, db)


def _pkcs11_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KeyStore]:
    module, label = softhsm_token(tmp_path, request.getfixturevalue("monkeypatch"))
    ks = Pkcs11KeyStore(module, label, PIN)
    try:
        yield ks
    finally:
        ks.close()


IMPLEMENTATIONS: dict[type, Callable[[Path, pytest.FixtureRequest], Iterator[KeyStore]]] = {
    FileKeyStore: _file_store,
    SharedKeyStore: _shared_store,
    Pkcs11KeyStore: _pkcs11_store,
}
# a store over a database runs on each real one
_DATABASES: dict[type, tuple[str | None, ...]] = {SharedKeyStore: ("sqlite_db", "postgres_db")}
_MARKS: dict[type | str, list[pytest.MarkDecorator]] = {Pkcs11KeyStore: [pytest.mark.hsm],
                                                       "postgres_db": [pytest.mark.postgres]}


@pytest.fixture(
    params=[
        pytest.param((cls, where), id=cls.__module__ + (f"-{where.split('_')[0]}" if where else ""),
                     marks=[*_MARKS.get(cls, []), *_MARKS.get(where or "", [])])
        for cls in IMPLEMENTATIONS
        for where in _DATABASES.get(cls, (None,))
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyStore]:
    cls = request.param[0]
    built = IMPLEMENTATIONS[cls](tmp_path, request)
    ks = next(built)
    assert isinstance(ks, cls)
    yield ks
    next(built, None)  # runs the builder's cleanup


def test_every_implementation_is_conformance_tested() -> None:
    """Every class in keys/ that has the KeyStore methods is in IMPLEMENTATIONS."""
    import importlib
    import inspect
    import pkgutil

    import keys

    found = set()
    for info in pkgutil.iter_modules(keys.__path__):
        module = importlib.import_module(f"keys.{info.name}")
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            methods = ("generate", "get", "exists", "delete")
            concrete = cls.__module__ == module.__name__ and cls is not KeyStore  # not the protocol itself
            if concrete and all(callable(getattr(cls, m, None)) for m in methods):
                found.add(cls)
    assert found == set(IMPLEMENTATIONS), found ^ set(IMPLEMENTATIONS)


def _verify(signer: Signer, data: bytes, sig: bytes) -> None:
    pub = signer.public_key()
    if isinstance(pub, ed25519.Ed25519PublicKey):
        assert len(sig) == 64
        pub.verify(sig, data)
    else:
        algo = hash_for(signer.kind)
        assert algo is not None
        pub.verify(sig, data, ec.ECDSA(algo))


@pytest.mark.parametrize("kind", list(KeyKind))
def test_generate_sign_verify_get(store: KeyStore, kind: KeyKind) -> None:
    signer = store.generate(f"k-{kind.value}", kind)
    assert signer.kind is kind and signer.key_id == f"k-{kind.value}"
    _verify(signer, b"payload", signer.sign(b"payload"))
    again = store.get(f"k-{kind.value}")
    assert again.kind is kind
    _verify(again, b"other", again.sign(b"other"))
    assert again.public_key() == signer.public_key()
    with pytest.raises(InvalidSignature):
        _verify(again, b"tampered", again.sign(b"other"))


@pytest.mark.parametrize("kind", list(KeyKind))
def test_private_key_object_signs_certificates_and_jwts(store: KeyStore, kind: KeyKind) -> None:
    signer = store.generate("ca", kind)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(signer.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(signer.private_key(), hash_for(kind))  # type: ignore[arg-type]
    )
    cert.verify_directly_issued_by(cert)
    token = jwt.encode({"sub": "x"}, signer.private_key(), algorithm=jwt_alg(kind))
    assert jwt.decode(token, signer.public_key(), algorithms=[jwt_alg(kind)]) == {"sub": "x"}


def test_contract_errors(store: KeyStore) -> None:
    store.generate("a", KeyKind.EC_P256)
    with pytest.raises(KeyExists):
        store.generate("a", KeyKind.ED25519)
    assert store.exists("a") and not store.exists("b")
    with pytest.raises(KeyNotFound):
        store.get("b")
    store.delete("a")
    assert not store.exists("a")
    with pytest.raises(KeyNotFound):
        store.get("a")
    with pytest.raises(KeyNotFound):
        store.delete("a")
    with pytest.raises(KeyStoreError):
        store.generate("../escape", KeyKind.EC_P256)


# --- file store specifics -------------------------------------------------------------------------


def test_file_store_never_writes_private_bytes_in_clear(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    ks = FileKeyStore.open(tmp_path / "keys", passphrase="correct horse battery")
    signer = ks.generate("ca", KeyKind.EC_P256)
    key = signer.private_key()
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    for path in (tmp_path / "keys").iterdir():
        data = path.read_bytes()
        assert der not in data and scalar not in data, path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    # a new process with the same passphrase reads it; a wrong one is refused at open
    again = FileKeyStore.open(tmp_path / "keys", passphrase="correct horse battery").get("ca")
    assert again.public_key() == signer.public_key()
    with pytest.raises(KeyStoreError, match="wrong passphrase"):
        FileKeyStore.open(tmp_path / "keys", passphrase="wrong horse battery")


def test_file_store_binds_key_id_swapped_files_fail(tmp_path: Path) -> None:
    kf = FileKeyStore.create_key_file(tmp_path / "k")
    ks = FileKeyStore.open(tmp_path / "keys", key_file=kf)
    ks.generate("a", KeyKind.EC_P256)
    ks.generate("b", KeyKind.EC_P256)
    a, b = tmp_path / "keys" / "a.key", tmp_path / "keys" / "b.key"
    a.write_bytes(b.read_bytes().replace(b'"key_id": "b"', b'"key_id": "a"'))
    with pytest.raises(KeyStoreError, match="does not decrypt"):
        FileKeyStore.open(tmp_path / "keys", key_file=kf).get("a")


def test_key_file_rules(tmp_path: Path) -> None:
    kf = FileKeyStore.create_key_file(tmp_path / "k")
    assert stat.S_IMODE(kf.stat().st_mode) == 0o600 and len(kf.read_bytes()) == 32
    with pytest.raises(KeyStoreError, match="exists already"):
        FileKeyStore.create_key_file(kf)
    os.chmod(kf, 0o644)
    with pytest.raises(KeyStoreError, match="chmod 600"):
        FileKeyStore.open(tmp_path / "keys", key_file=kf)
    with pytest.raises(KeyStoreError, match="does not exist"):
        FileKeyStore.open(tmp_path / "keys", key_file=tmp_path / "missing")
    with pytest.raises(KeyStoreError, match="exactly one"):
        FileKeyStore.open(tmp_path / "keys")
    with pytest.raises(KeyStoreError, match="exactly one"):
        FileKeyStore.open(tmp_path / "keys", passphrase="long enough", key_file=kf)
    os.chmod(kf, 0o600)
    FileKeyStore.open(tmp_path / "keys", key_file=kf)
    other = FileKeyStore.create_key_file(tmp_path / "k2")
    with pytest.raises(KeyStoreError, match="wrong passphrase or key file"):
        FileKeyStore.open(tmp_path / "keys", key_file=other)


def test_repr_never_shows_key_material(tmp_path: Path) -> None:
    ks = FileKeyStore.open(tmp_path / "keys", key_file=FileKeyStore.create_key_file(tmp_path / "k"))
    signer = ks.generate("a", KeyKind.ED25519)
    raw = signer.private_key()
    assert isinstance(raw, ed25519.Ed25519PrivateKey)
    assert raw.private_bytes_raw().hex() not in repr(signer) + repr(ks)


# --- PKCS#11 specifics ------------------------------------------------------------------------------


@pytest.mark.hsm
def test_token_key_is_sensitive_and_not_extractable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pkcs11
    from pkcs11 import Attribute

    from keys.pkcs11 import Pkcs11Signer

    module, label = softhsm_token(tmp_path, monkeypatch)
    ks = Pkcs11KeyStore(module, label, PIN)
    try:
        signer = ks.generate("ca", KeyKind.EC_P256)
        assert isinstance(signer, Pkcs11Signer)
        handle = signer.handle
        assert handle[Attribute.SENSITIVE] is True
        assert handle[Attribute.EXTRACTABLE] is False
        assert handle[Attribute.NEVER_EXTRACTABLE] is True
        assert handle[Attribute.LOCAL] is True  # generated inside the token
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            handle[Attribute.VALUE]
        with pytest.raises(TypeError, match="non-extractable"):
            signer.private_key().private_bytes()  # type: ignore[call-arg]
    finally:
        ks.close()
    with pytest.raises(KeyStoreError, match="wrong PIN"):
        Pkcs11KeyStore(module, label, "not-the-pin")
    with pytest.raises(KeyStoreError, match="no PKCS#11 token"):
        Pkcs11KeyStore(module, "no-such-token", PIN)


def test_racing_generates_of_one_id_leave_exactly_one_key(tmp_path: Path) -> None:
    import threading

    ks = FileKeyStore.open(tmp_path / "keys", key_file=FileKeyStore.create_key_file(tmp_path / "k"))
    barrier = threading.Barrier(6)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt() -> None:
        barrier.wait()
        try:
            ks.generate("same", KeyKind.EC_P256)
            outcome = "created"
        except KeyExists:
            outcome = "exists"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=attempt) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] + ["exists"] * 5
    names = sorted(p.name for p in (tmp_path / "keys").iterdir())
    assert names == ["master.check", "same.key"]  # no temporary file left behind
    fresh = FileKeyStore.open(tmp_path / "keys", key_file=tmp_path / "k")
    assert fresh.get("same").public_key() == ks.get("same").public_key()  # the winner's key is the one on disk
