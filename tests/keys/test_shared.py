"""The shared key store's own rules (the KeyStore contract itself: test_conformance.py), on real SQLite and
PostgreSQL: the table holds the key files' ciphertext and nothing else, a blob under another master key is refused
naming the cause, a key here is never overwritten by one from the database."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from keys.errors import KeyExists, KeyNotFound, WrongMasterKey
from keys.file import FileKeyStore
from keys.shared import SharedKeyStore
from keys.store import KeyKind
from store.db import Database


def _replica(tmp_path: Path, name: str, db: Database, master: Path | None = None) -> SharedKeyStore:
    """A key store of its own on `db`, under the master key file `master` (copied) or one of its own."""
    key_file = tmp_path / f"{name}.master"
    if master is None:
        FileKeyStore.create_key_file(key_file)
    else:
        shutil.copy2(master, key_file)
    return SharedKeyStore(FileKeyStore.open(tmp_path / name, key_file=key_file), db)


def _secrets(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> list[bytes]:
    """Every clear form of a private key: PKCS#8 DER and PEM, the raw scalar or seed (and OpenSSL's PEM for EC)."""
    none = serialization.NoEncryption()
    out = [key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, none),
           key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, none)]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        out.append(key.private_bytes_raw())
    else:
        out.append(key.private_numbers().private_value.to_bytes((key.curve.key_size + 7) // 8, "big"))
        out.append(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, none))
    return out


def test_the_table_holds_the_key_files_ciphertext_and_no_private_byte(db: Database, tmp_path: Path) -> None:
    store = _replica(tmp_path, "a", db)
    held = {kind: store.generate(f"k-{kind.value}", kind) for kind in KeyKind}
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT key_id, kind, blob, created_at FROM key_blobs ORDER BY key_id")).all()
    assert [(r.key_id, r.kind) for r in rows] == sorted((f"k-{k.value}", k.value) for k in KeyKind)
    everything = b"\n".join(bytes(r.blob) + f"{r.key_id} {r.kind} {r.created_at}".encode() for r in rows)
    for kind, signer in held.items():
        key = signer.private_key()
        assert isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey)
        for secret in _secrets(key):
            assert secret not in everything and secret.hex().encode() not in everything, kind
    for row in rows:  # exactly the bytes of the file, which decrypt under the master key only
        assert bytes(row.blob) == (tmp_path / "a" / f"{row.key_id}.key").read_bytes()


def test_a_key_made_on_one_replica_is_fetched_as_an_identical_private_file(db: Database, tmp_path: Path) -> None:
    a = _replica(tmp_path, "a", db)
    b = _replica(tmp_path, "b", db, master=tmp_path / "a.master")
    made = a.generate("jwt-g2-x", KeyKind.EC_P256)
    assert not (tmp_path / "b" / "jwt-g2-x.key").exists()
    assert b.exists("jwt-g2-x")
    fetched = tmp_path / "b" / "jwt-g2-x.key"
    assert fetched.read_bytes() == (tmp_path / "a" / "jwt-g2-x.key").read_bytes()
    assert fetched.stat().st_mode & 0o777 == 0o600
    assert b.get("jwt-g2-x").public_key() == made.public_key()
    with pytest.raises(KeyExists, match="published in the database's shared keys"):
        b.generate("jwt-g2-x", KeyKind.EC_P256)
    with pytest.raises(KeyNotFound, match=r"no key 'other' in the key store at .* nor in the database's shared keys"):
        b.get("other")


def test_a_blob_under_another_master_key_is_refused_and_nothing_written(db: Database, tmp_path: Path) -> None:
    a = _replica(tmp_path, "a", db)
    other = _replica(tmp_path, "other", db)  # a master key of its own
    a.generate("ca-g2-root-x", KeyKind.EC_P384)
    for fetch in (other.get, other.exists):
        with pytest.raises(WrongMasterKey, match=r"key 'ca-g2-root-x' from the database's shared keys \(key_blobs\) "
                                                 r"does not decrypt under the master key .*made under another master"):
            fetch("ca-g2-root-x")
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["master.check"]


def test_a_blob_never_overwrites_a_key_held_here(db: Database, tmp_path: Path) -> None:
    a = _replica(tmp_path, "a", db)
    b = _replica(tmp_path, "b", db, master=tmp_path / "a.master")
    a.generate("k", KeyKind.ED25519)
    mine = b.files.generate("k", KeyKind.ED25519)  # a file of that id made here, before it was fetched
    before = (tmp_path / "b" / "k.key").read_bytes()
    with pytest.raises(KeyExists, match=r"differs from the key file k\.key"):
        b.files.adopt("k", a.files.blob("k"), source="the database")
    assert (tmp_path / "b" / "k.key").read_bytes() == before
    assert b.get("k").public_key() == mine.public_key()  # the file here is the key this replica signs with


def test_delete_removes_the_key_for_every_replica(db: Database, tmp_path: Path) -> None:
    a = _replica(tmp_path, "a", db)
    b = _replica(tmp_path, "b", db, master=tmp_path / "a.master")
    a.generate("k", KeyKind.EC_P256)
    a.delete("k")
    assert not b.exists("k") and not a.exists("k")


def _row_ids(db: Database) -> set[str]:
    """The ids in key_blobs, as another connection sees them."""
    with db.statement() as conn:
        return {r.key_id for r in conn.execute(text("SELECT key_id FROM key_blobs"))}


class _Failed(Exception):
    pass


def test_a_key_made_in_a_transaction_that_rolls_back_leaves_no_row_nor_file(db: Database, tmp_path: Path) -> None:
    """Should fix: on PostgreSQL the row committed in a transaction of its own before generate returned, so a CA
    rotation that failed after making its keys left their rows for every replica (and on both databases the files
    here): keys no CA generation uses."""
    store = _replica(tmp_path, "a", db)
    with pytest.raises(_Failed), db.session():
        store.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)
        assert _row_ids(db) == set()  # another connection sees it only once the transaction commits
        raise _Failed
    assert _row_ids(db) == set() and not store.files.exists("ca-g2-root-0badc0de")
    with pytest.raises(KeyNotFound):
        store.get("ca-g2-root-0badc0de")
    with db.session():
        made = store.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)  # the same id again, committed this time
    assert _row_ids(db) == {"ca-g2-root-0badc0de"}
    assert store.get("ca-g2-root-0badc0de").public_key() == made.public_key()


def test_a_key_goes_with_the_savepoint_it_was_made_in_and_stays_with_a_commit(db: Database, tmp_path: Path) -> None:
    store = _replica(tmp_path, "a", db)
    with db.session() as session:
        store.generate("kept", KeyKind.EC_P256)
        with pytest.raises(_Failed), session.begin_nested():
            store.generate("in-savepoint", KeyKind.EC_P256)
            raise _Failed
        assert not store.files.exists("in-savepoint")
        with session.begin_nested():
            store.generate("released", KeyKind.EC_P256)  # a released savepoint's key commits with the transaction
    assert _row_ids(db) == {"kept", "released"}
    assert sorted(store.files.key_ids()) == ["kept", "released"]
    with pytest.raises(_Failed), db.session() as session:
        with session.begin_nested():
            store.generate("released-then-rolled-back", KeyKind.ED25519)
        raise _Failed
    assert _row_ids(db) == {"kept", "released"} and store.files.key_ids() == ["kept", "released"]


def test_a_key_made_outside_a_transaction_is_published_at_once(db: Database, tmp_path: Path) -> None:
    """The audit and API-issuer keys: generate commits the row itself, before it returns."""
    store = _replica(tmp_path, "a", db)
    store.generate("audit-checkpoint", KeyKind.ED25519)
    assert _row_ids(db) == {"audit-checkpoint"}


@pytest.mark.postgres
def test_a_key_made_in_a_transaction_whose_connection_is_lost_leaves_no_row_nor_file(postgres_db: Database,
                                                                                     tmp_path: Path) -> None:
    """The server ends the connection before COMMIT (a restart, a failover): the transaction is gone, and the key
    with it."""
    store = _replica(tmp_path, "a", postgres_db)
    with pytest.raises(OperationalError, match="terminating connection"), postgres_db.session() as session:
        store.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)
        backend = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with postgres_db.statement() as other:
            assert other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend}).scalar()
    assert _row_ids(postgres_db) == set() and not store.files.exists("ca-g2-root-0badc0de")
