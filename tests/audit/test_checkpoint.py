"""Signed checkpoints: the C2SP signed-note format, the audit key in the KeyStore, the writer policy."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from sqlmodel import select

from audit import checkpoint as cpm
from audit import merkle, service
from audit.errors import AuditKeyMissing, CheckpointError
from audit.models import AuditCheckpoint
from core.clock import FrozenClock
from keys import KeyKind
from keys.file import FileKeyStore
from keys.pkcs11 import Pkcs11KeyStore
from store.db import Database
from tests.audit.conftest import T0, KeySigner, fill
from tests.keys.stores import PIN, softhsm_token


def test_note_format_and_signature(signer: KeySigner) -> None:
    root = hashlib.sha256(b"root").digest()
    note = cpm.sign_checkpoint(signer, "example.com/audit", 42, root)
    body, sig_line = note.split("\n\n")
    assert body == f"example.com/audit\n42\n{base64.b64encode(root).decode()}"
    assert sig_line.startswith("\u2014 example.com/audit ") and sig_line.endswith("\n")
    blob = base64.b64decode(sig_line.rsplit(" ", 1)[1])
    raw = signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert blob[:4] == hashlib.sha256(b"example.com/audit\n\x01" + raw).digest()[:4]
    signer.public_key().verify(blob[4:], (body + "\n").encode())
    cp = cpm.verify_checkpoint(note, signer.public_key())
    assert (cp.origin, cp.size, cp.root) == ("example.com/audit", 42, root)
    for _ in range(20):  # base64 key material often holds '+', the field separator
        other = KeySigner()
        vk = cpm.verifier_key("example.com/audit", other.public_key())
        assert cpm.load_public_key(vk).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == (
            other.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )
    vkey = cpm.verifier_key("example.com/audit", signer.public_key())
    assert cpm.load_public_key(vkey).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw


def test_go_signed_note_known_answer() -> None:
    """A note signed by golang.org/x/mod/sumdb/note (its documented example key) verifies here."""
    vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
    note = (
        "If you think cryptography is the answer to your problem,\n"
        "then you don't know what your problem is.\n\n"
        "\u2014 PeterNeumann "
        "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
    )
    key = cpm.load_public_key(vkey)
    body, line = note.split("\n\n")
    blob = base64.b64decode(line.rsplit(" ", 1)[1])
    assert blob[:4].hex() == "c74f20a3"
    key.verify(blob[4:], (body + "\n").encode())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda n: n.replace("\n42\n", "\n43\n"),  # forged size
        lambda n: n.replace("trustfabric/audit\n", "evil/audit\n", 1),  # forged origin
    ],
)
def test_forged_checkpoint_is_rejected(signer: KeySigner, mutate: object) -> None:
    note = cpm.sign_checkpoint(signer, "trustfabric/audit", 42, hashlib.sha256(b"r").digest())
    with pytest.raises(CheckpointError):
        cpm.verify_checkpoint(mutate(note), signer.public_key())  # type: ignore[operator]


def test_resigned_checkpoint_is_rejected(signer: KeySigner) -> None:
    note = cpm.sign_checkpoint(KeySigner(), "trustfabric/audit", 42, hashlib.sha256(b"r").digest())
    with pytest.raises(CheckpointError, match="not signed by the given audit public key"):
        cpm.verify_checkpoint(note, signer.public_key())


def test_non_ascii_in_a_base64_field_is_a_checkpoint_error(signer: KeySigner) -> None:
    """b64decode raises a bare ValueError, not binascii.Error, for non-ASCII text: it leaked to the CLI."""
    root = hashlib.sha256(b"r").digest()
    note = cpm.sign_checkpoint(signer, "trustfabric/audit", 42, root)
    counted = cpm.sign_checkpoint(signer, "trustfabric/audit", 42, root, ["trustfabric-counters 0 1 r\u00e9=="])
    for bad, field in [
        (note.replace("\n42\n", "\n42\n\u00e9", 1), "root hash"),
        (note[:-3] + "\u00e9=\n", "signature"),
        (counted, "counters root"),  # signed as it is: parsed once the signature verified
    ]:
        with pytest.raises(CheckpointError, match=f"checkpoint {field} is not base64"):
            cpm.verify_checkpoint(bad, signer.public_key())


def test_a_file_that_is_no_key_is_a_checkpoint_error() -> None:
    """A text with two '+' (a README, an export given as the key by mistake) is no key at all: said as such,
    not as a verifier key whose 'key material is not base64'; a one-line verifier key with bad material is."""
    for text in ("# notes\nC++ and a+b \u2014 caf\u00e9\n", '{"note": "a+b"}\n{"note": "c+d"}\n',
                 "C++ and a+b \u2014 caf\u00e9"):
        with pytest.raises(CheckpointError, match="neither a PEM Ed25519 key nor a signed-note verifier key"):
            cpm.load_public_key(text)
    with pytest.raises(CheckpointError, match="key material is not base64"):
        cpm.load_public_key("example.org/audit+0a1b2c3d+\u00e9\u00e9\u00e9")


def test_write_checkpoint_signs_the_head(db: Database, signer: KeySigner) -> None:
    empty = cpm.write_checkpoint(db, signer)
    assert empty.size == 0 and empty.root_hash == merkle.EMPTY_ROOT.hex()
    fill(db, 13)
    cp = cpm.write_checkpoint(db, signer)
    again = cpm.write_checkpoint(db, signer)
    assert again.id == cp.id  # same size: the stored checkpoint is reused
    parsed = cpm.verify_checkpoint(cp.note, signer.public_key())
    with db.read_session() as s:
        assert parsed.size == 13 and parsed.root == service.root_at(s, 13)
        assert len(s.exec(select(AuditCheckpoint)).all()) == 2


def test_writer_every_n_events_or_t_seconds(sqlite_db: Database, signer: KeySigner) -> None:
    clock = FrozenClock(T0)
    writer = cpm.CheckpointWriter(sqlite_db, signer, every_events=10, every_seconds=60, clock=clock)
    assert writer.maybe_write() is None  # nothing to sign yet
    fill(sqlite_db, 3)
    first = writer.maybe_write()
    assert first is not None and first.size == 3  # the first events get a checkpoint
    fill(sqlite_db, 5, start=3)
    assert writer.maybe_write() is None  # 5 < 10 events and no time passed
    clock.advance(timedelta(seconds=61))
    assert (cp := writer.maybe_write()) is not None and cp.size == 8
    fill(sqlite_db, 10, start=8)
    assert (cp := writer.maybe_write()) is not None and cp.size == 18
    clock.advance(timedelta(seconds=600))
    assert writer.maybe_write() is None  # time passed but nothing new


def test_writer_thread(sqlite_db: Database, signer: KeySigner) -> None:
    writer = cpm.CheckpointWriter(sqlite_db, signer, every_events=1, every_seconds=3600)
    fill(sqlite_db, 2)
    writer.start(poll_seconds=0.01)
    try:
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with sqlite_db.read_session() as s:
                if cpm.latest_checkpoint(s) is not None:
                    break
            time.sleep(0.02)
    finally:
        writer.stop()
    with sqlite_db.read_session() as s:
        latest = cpm.latest_checkpoint(s)
    assert latest is not None and latest.size == 2


def test_bad_writer_settings() -> None:
    with pytest.raises(CheckpointError):
        cpm.CheckpointWriter(None, KeySigner(), every_events=0)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError):
        cpm.CheckpointWriter(None, KeySigner(), origin="has space")  # type: ignore[arg-type]


def test_ensure_audit_key_with_the_file_keystore(tmp_path: Path) -> None:
    ks = FileKeyStore.open(tmp_path / "keys", passphrase="correct horse battery staple")
    with pytest.raises(AuditKeyMissing):
        cpm.audit_signer(ks)
    cpm.ensure_audit_key(ks)
    first = cpm.public_key_pem(cpm.audit_signer(ks))
    cpm.ensure_audit_key(ks)  # idempotent: the key is kept
    assert cpm.public_key_pem(cpm.audit_signer(ks)) == first
    assert ks.get(cpm.AUDIT_KEY_ID).kind is KeyKind.ED25519
    note = cpm.sign_checkpoint(cpm.audit_signer(ks), "trustfabric/audit", 1, hashlib.sha256(b"x").digest())
    cpm.verify_checkpoint(note, cpm.load_public_key(first))
    ks.generate("ca-root", KeyKind.EC_P256)
    assert ks.exists("ca-root") and cpm.AUDIT_KEY_ID != "ca-root"


def test_a_non_ed25519_audit_key_is_refused(tmp_path: Path) -> None:
    ks = FileKeyStore.open(tmp_path / "keys", passphrase="correct horse battery staple")
    ks.generate(cpm.AUDIT_KEY_ID, KeyKind.EC_P256)
    with pytest.raises(CheckpointError, match="Ed25519"):
        cpm.ensure_audit_key(ks)


@pytest.mark.hsm
def test_audit_key_in_a_pkcs11_token_signs_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_db: Database
) -> None:
    module, label = softhsm_token(tmp_path, monkeypatch)
    ks = Pkcs11KeyStore(module, label, PIN)
    cpm.ensure_audit_key(ks)
    cpm.ensure_audit_key(ks)  # idempotent
    signer = cpm.audit_signer(ks)
    fill(sqlite_db, 9)
    cp = cpm.write_checkpoint(sqlite_db, signer)
    parsed = cpm.verify_checkpoint(cp.note, cpm.load_public_key(cpm.public_key_pem(signer)))
    assert parsed.size == 9


# --- issue 13 item 4: a signed time, and consistency with a checkpoint the auditor kept ---------------


def test_a_checkpoint_signs_its_time_and_the_counters(sqlite_db: Database, signer: KeySigner) -> None:
    fill(sqlite_db, 5)
    cp = cpm.write_checkpoint(sqlite_db, signer, clock=FrozenClock(T0 + timedelta(hours=1, microseconds=7)))
    body = cp.note.split("\n\n")[0].split("\n")
    assert body[3] == "trustfabric-time 2026-01-01T01:00:00.000007Z"
    assert body[4].startswith("trustfabric-counters 0 ")  # counted from the first event; then keys, root
    parsed = cpm.verify_checkpoint(cp.note, signer.public_key())
    assert parsed.time == T0 + timedelta(hours=1, microseconds=7)
    assert parsed.counters is not None and parsed.counters.counted_from == 0 and parsed.counters.keys > 0
    backdated = cp.note.replace("2026-01-01T01:00", "2025-01-01T01:00")  # the time is under the signature
    with pytest.raises(CheckpointError, match="altered"):
        cpm.verify_checkpoint(backdated, signer.public_key())


def test_a_note_without_extension_lines_still_verifies(signer: KeySigner) -> None:
    """Checkpoints signed before this change carry no time: they verify, with time None."""
    note = cpm.sign_checkpoint(signer, "example.com/audit", 3, hashlib.sha256(b"r").digest())
    parsed = cpm.verify_checkpoint(note, signer.public_key())
    assert (parsed.time, parsed.counters) == (None, None)


def _export(db: Database, signer: KeySigner, **kwargs: object) -> bytes:
    import io

    from audit.export import export_events

    buf = io.BytesIO()
    export_events(db, signer, buf, **kwargs)  # type: ignore[arg-type]
    return buf.getvalue()


def test_verify_since_a_kept_checkpoint(sqlite_db: Database, signer: KeySigner) -> None:
    import io

    from audit.errors import Inconsistent, StaleCheckpoint, Unproven
    from audit.export import ExportFilter
    from audit.verify import verify_export

    key = signer.public_key()
    fill(sqlite_db, 41)  # 41: inside a gap subtree of the tenant export below ([40, 42) is not acme's)
    old = _export(sqlite_db, signer)
    kept = cpm.verify_checkpoint(json.loads(old.split(b"\n", 1)[0])["header"]["checkpoint"], key)
    fill(sqlite_db, 20, start=41)
    new = _export(sqlite_db, signer)
    # a whole export proves it extends the kept tree by rebuilding it (both passes)
    for fast in (True, False):
        assert verify_export(io.BytesIO(new), key, since=kept, fast=fast).tree_size == 61
    assert verify_export(io.BytesIO(old), key, since=kept).tree_size == 41  # the same checkpoint
    # an export cut back to an older checkpoint does not pass as current
    newer = cpm.verify_checkpoint(json.loads(new.split(b"\n", 1)[0])["header"]["checkpoint"], key)
    with pytest.raises(StaleCheckpoint, match="older than the one you kept"):
        verify_export(io.BytesIO(old), key, since=newer)
    # a filtered export has gap hashes where the kept tree ends: it needs the RFC 6962 proof
    tenant = ExportFilter(tenant="acme")
    with pytest.raises(Unproven, match="no consistency proof from tree size 41"):
        verify_export(io.BytesIO(_export(sqlite_db, signer, filters=tenant)), key, since=kept)
    proven = _export(sqlite_db, signer, filters=tenant, since_checkpoint=kept)
    assert verify_export(io.BytesIO(proven), key, since=kept).events > 0
    header = json.loads(proven.split(b"\n", 1)[0])
    header["header"]["consistency"]["proof"][0] = base64.b64encode(hashlib.sha256(b"x").digest()).decode()
    forged = json.dumps(header).encode() + b"\n" + proven.split(b"\n", 1)[1]
    with pytest.raises(Inconsistent):
        verify_export(io.BytesIO(forged), key, since=kept)


def test_a_rewritten_log_is_inconsistent_with_the_kept_checkpoint(
    sqlite_db: Database, signer: KeySigner, tmp_path: Path
) -> None:
    """Someone with the database and the key service rebuilds the log from event 10 on: its new exports
    verify alone, but not against what the auditor kept."""
    import io

    from audit.errors import Inconsistent
    from audit.verify import verify_export
    from store.db import sqlite_url
    from workflows.schema import migrate

    fill(sqlite_db, 30)
    kept = cpm.verify_checkpoint(cpm.write_checkpoint(sqlite_db, signer).note, signer.public_key())
    (tmp_path / "rewritten").mkdir()
    other = Database(sqlite_url(tmp_path / "rewritten"))
    migrate(other.engine)
    fill(other, 10)
    fill(other, 25, start=11)  # event 10 left out, the rest rewritten
    rewritten = _export(other, signer)
    other.dispose()
    verify_export(io.BytesIO(rewritten), signer.public_key())  # alone it verifies
    with pytest.raises(Inconsistent):
        verify_export(io.BytesIO(rewritten), signer.public_key(), since=kept)
