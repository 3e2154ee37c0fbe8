"""The deployment marker the PKCS#11 store puts on each key pair it makes (keys/deployment.py), and what reads it:
key_owners names whose a key is, destroy_marked takes exactly the pair its marker names."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from pkcs11 import Attribute, KeyType, Mechanism
from pkcs11.util.ec import encode_named_curve_parameters
from sqlalchemy import insert, update

from keys.adoption import TABLE as ADOPTED
from keys.adoption import spki_sha256
from keys.deployment import ORIGIN_UPGRADE, TABLE, marker, marker_owner
from keys.errors import KeyExists, KeyNotFound, KeyStoreError
from keys.pkcs11 import Pkcs11KeyStore, Pkcs11Signer, _der_octet_string
from keys.store import KeyKind, MarkedKeyStore
from store.db import Database
from tests.keys.stores import PIN, softhsm_token, token_objects

MINE, THEIRS = "a" * 32, "b" * 32


def test_a_marker_names_its_deployment_only_for_the_key_it_was_made_for() -> None:
    assert marker(MINE, "ca-g1-root-01234567") == b"trustfabric/" + MINE.encode() + b"/ca-g1-root-01234567"
    assert marker_owner(marker(MINE, "ca-g1-root-01234567"), "ca-g1-root-01234567") == MINE
    assert marker_owner(marker(MINE, "ca-g1-root-01234567"), "ca-g1-root-89abcdef") is None  # a copied marker
    for foreign in (b"", b"\x01\x02", b"trustfabric/" + b"A" * 32 + b"/k", b"trustfabric/abc/k"):
        assert marker_owner(foreign, "k") is None
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        marker("not-an-id", "k")


@pytest.mark.hsm
def test_destroy_marked_takes_only_the_pair_its_marker_names(
        sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, label = softhsm_token(tmp_path, monkeypatch)
    with sqlite_db.engine.begin() as conn:
        conn.execute(insert(TABLE).values(id=1, deployment_id=MINE, created_at=datetime.now(UTC)))
    ks = Pkcs11KeyStore(module, label, PIN, db=sqlite_db)
    try:
        assert isinstance(ks, MarkedKeyStore)
        ks.generate("ca-g2-root-0badc0de", KeyKind.EC_P256)
        ks.generate("ca-g2-issuing-0badc0de", KeyKind.EC_P256)
        assert ks.key_owners() == {"ca-g2-root-0badc0de": MINE, "ca-g2-issuing-0badc0de": MINE}
        # another deployment's pair of the same label, made beside it by other means (generate refuses a label held)
        params = ks._session.create_domain_parameters(  # the raw token session, as other software
            KeyType.EC, {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters("secp256r1"))}, local=True)
        params.generate_keypair(id=marker(THEIRS, "ca-g2-root-0badc0de"), label="ca-g2-root-0badc0de", store=True,
                                mechanism=Mechanism.EC_KEY_PAIR_GEN)
        assert ks.key_owners()["ca-g2-root-0badc0de"] == MINE  # a label two share: the one this deployment uses
        assert ks.destroy_marked("ca-g2-issuing-0badc0de", THEIRS) is False  # not theirs: left
        assert ks.destroy_marked("ca-g2-root-0badc0de", MINE) is True
        assert ks.key_owners() == {"ca-g2-root-0badc0de": THEIRS, "ca-g2-issuing-0badc0de": MINE}
        assert token_objects(module, label) == {(k, cls) for k in ("ca-g2-root-0badc0de", "ca-g2-issuing-0badc0de")
                                                for cls in ("PRIVATE_KEY", "PUBLIC_KEY")}
        assert ks.destroy_marked("ca-g2-root-0badc0de", MINE) is False  # gone already
    finally:
        ks.close()


def _raw_pair(ks: Pkcs11KeyStore, label: str, cka_id: bytes | None) -> bytes:
    """A key pair made beside the store by other means (another deployment's process, other software); the public
    point."""
    params = ks._session.create_domain_parameters(  # the raw token session
        KeyType.EC, {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters("secp256r1"))}, local=True)
    pub, _priv = params.generate_keypair(id=cka_id, label=label, store=True, mechanism=Mechanism.EC_KEY_PAIR_GEN)
    return bytes(pub[Attribute.EC_POINT])


def _point(ks: Pkcs11KeyStore, key_id: str) -> bytes:
    from cryptography.hazmat.primitives import serialization

    public = ks.get(key_id).public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    return public.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


@pytest.mark.hsm
def test_lookups_take_this_deployments_key_else_an_unmarked_one_never_anothers(
        sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed label (audit-checkpoint) another deployment made in a shared token is not this deployment's key: get,
    exists and delete do not see it, and generate makes one of this deployment's own beside it, which get then
    serves. An unmarked key (made before markers) is used as before, until this deployment has one of its own."""
    module, label = softhsm_token(tmp_path, monkeypatch)
    with sqlite_db.engine.begin() as conn:  # a deployment whose keys predate markers: it uses unmarked ones
        conn.execute(insert(TABLE).values(id=1, deployment_id=MINE, created_at=datetime.now(UTC),
                                          origin=ORIGIN_UPGRADE))
    ks = Pkcs11KeyStore(module, label, PIN, db=sqlite_db)
    try:
        theirs = _raw_pair(ks, "audit-checkpoint", marker(THEIRS, "audit-checkpoint"))
        assert not ks.exists("audit-checkpoint") and ks.key_owners() == {"audit-checkpoint": THEIRS}
        with pytest.raises(KeyNotFound):
            ks.get("audit-checkpoint")
        with pytest.raises(KeyNotFound):
            ks.delete("audit-checkpoint")
        ks.generate("audit-checkpoint", KeyKind.EC_P256)  # no KeyExists: theirs is not ours
        ours = _point(ks, "audit-checkpoint")
        assert ours != b"" and _der_octet_string(theirs) != ours and ks.exists("audit-checkpoint")
        assert ks.key_owners() == {"audit-checkpoint": MINE}
        with pytest.raises(KeyExists):
            ks.generate("audit-checkpoint", KeyKind.EC_P256)
        ks.delete("audit-checkpoint")  # ours, both objects; theirs stays
        assert token_objects(module, label) == {("audit-checkpoint", "PRIVATE_KEY"), ("audit-checkpoint", "PUBLIC_KEY")}
        assert ks.key_owners() == {"audit-checkpoint": THEIRS}

        legacy = _raw_pair(ks, "api-issuer", None)  # unmarked: made before markers existed
        assert ks.exists("api-issuer") and _point(ks, "api-issuer") == _der_octet_string(legacy)
        assert ks.key_owners()["api-issuer"] is None
        with pytest.raises(KeyExists):
            ks.generate("api-issuer", KeyKind.EC_P256)
        _raw_pair(ks, "api-issuer", marker(MINE, "api-issuer"))  # one of this deployment's own: it wins
        assert _point(ks, "api-issuer") != _der_octet_string(legacy) and ks.key_owners()["api-issuer"] == MINE
    finally:
        ks.close()


@pytest.mark.hsm
def test_a_committed_mark_keeps_lookups_and_stops_destroy_marked_even_half_set(
        sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mark_committed changes the pair's CKA_ID to the committed marker (private object first): get, exists and
    key_owners still find the key as this deployment's, committed_ids names it, and destroy_marked never takes it, also
    while only its private object carries the mark (a process stopped between the two writes)."""
    module, label = softhsm_token(tmp_path, monkeypatch)
    with sqlite_db.engine.begin() as conn:
        conn.execute(insert(TABLE).values(id=1, deployment_id=MINE, created_at=datetime.now(UTC), origin="init"))
    ks = Pkcs11KeyStore(module, label, PIN, db=sqlite_db)
    try:
        for key_id in ("ca-g1-root-01010101", "ca-g1-issuing-01010101", "ca-g9-root-09090909"):
            ks.generate(key_id, KeyKind.EC_P256)
        point = _point(ks, "ca-g1-root-01010101")
        assert ks.committed_ids() == set()
        assert ks.mark_committed("ca-g1-root-01010101") is True
        assert ks.mark_committed("ca-g1-root-01010101") is False  # marked already
        signer = ks.get("ca-g1-issuing-01010101")
        assert isinstance(signer, Pkcs11Signer)
        half = signer.handle  # its private object only: as a process stopped between the two writes leaves it
        half[Attribute.ID] = marker(MINE, "ca-g1-issuing-01010101") + b"/committed"
        assert ks.committed_ids() == {"ca-g1-root-01010101", "ca-g1-issuing-01010101"}
        assert ks.key_owners() == dict.fromkeys(
            ("ca-g1-root-01010101", "ca-g1-issuing-01010101", "ca-g9-root-09090909"), MINE)
        assert _point(ks, "ca-g1-root-01010101") == point and ks.exists("ca-g1-issuing-01010101")
        ks.get("ca-g1-issuing-01010101").sign(b"still its pair")
        assert ks.destroy_marked("ca-g1-root-01010101", MINE) is False
        assert ks.destroy_marked("ca-g1-issuing-01010101", MINE) is False
        assert ks.destroy_marked("ca-g9-root-09090909", MINE) is True  # never committed: taken, as before
        assert token_objects(module, label) == {(k, cls) for k in ("ca-g1-root-01010101", "ca-g1-issuing-01010101")
                                                for cls in ("PRIVATE_KEY", "PUBLIC_KEY")}
        assert ks.mark_committed("ca-g1-issuing-01010101") is True  # the public object's mark, completed
        raw = ks._session.get_objects({Attribute.LABEL: "ca-g1-issuing-01010101"})
        assert {bytes(o[Attribute.ID]) for o in raw} == {marker(MINE, "ca-g1-issuing-01010101") + b"/committed"}
        ks.delete("ca-g1-issuing-01010101")  # both objects, whatever their marks
        assert ("ca-g1-issuing-01010101", "PUBLIC_KEY") not in token_objects(module, label)
    finally:
        ks.close()


@pytest.mark.hsm
def test_a_deployment_made_with_markers_never_uses_an_unmarked_key(
        sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, label = softhsm_token(tmp_path, monkeypatch)
    with sqlite_db.engine.begin() as conn:
        conn.execute(insert(TABLE).values(id=1, deployment_id=MINE, created_at=datetime.now(UTC), origin="init"))
    ks = Pkcs11KeyStore(module, label, PIN, db=sqlite_db)
    try:
        planted = _raw_pair(ks, "api-issuer", None)
        assert not ks.adopts_unmarked() and not ks.exists("api-issuer")
        with pytest.raises(KeyNotFound, match="holds one without a deployment marker"):
            ks.get("api-issuer")
        with pytest.raises(KeyNotFound):
            ks.delete("api-issuer")
        ks.generate("api-issuer", KeyKind.EC_P256)  # no KeyExists: the unmarked one is not this deployment's
        assert _point(ks, "api-issuer") != _der_octet_string(planted)
        assert ks.mark_committed("api-issuer") is True and ks.key_owners() == {"api-issuer": MINE}
    finally:
        ks.close()


def _sha(point: bytes) -> str:
    """keys/adoption.py spki_sha256 of a P-256 public key given as its token CKA_EC_POINT."""
    return spki_sha256(ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _der_octet_string(point)))


@pytest.mark.hsm
def test_an_upgraded_deployment_uses_only_the_unmarked_keys_it_adopted(
        sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should fix: a deployment whose keys predate markers (origin `upgrade`) took an unmarked key of a label whenever
    it had no marked key of that label, for ever and for any label: a key planted later under a label it looked up
    for the first time (a CA key id a rotation was about to make), or swapped in for the one it used, signed for it.
    Once it recorded which unmarked keys it adopts (keys/adoption.py), it takes an unmarked key only when its public
    key is the one adopted under its label; until then, as before."""
    module, label = softhsm_token(tmp_path, monkeypatch)
    now = datetime.now(UTC)
    with sqlite_db.engine.begin() as conn:
        conn.execute(insert(TABLE).values(id=1, deployment_id=MINE, created_at=now, origin=ORIGIN_UPGRADE))
    ks = Pkcs11KeyStore(module, label, PIN, db=sqlite_db)
    try:
        legacy = _raw_pair(ks, "api-issuer", None)  # made before markers, used since
        _raw_pair(ks, "policy-signing", None)
        _raw_pair(ks, "policy-signing", b"\x01")  # two unmarked keys of one label: which one is its own is unknown
        _raw_pair(ks, "audit-checkpoint", marker(MINE, "audit-checkpoint"))  # its own: nothing to adopt
        _raw_pair(ks, "audit-checkpoint", None)
        assert ks.adopts_unmarked() and ks.unmarked_in_use() == {"api-issuer"}  # (several: none is used)
        assert ks.adoptable(["api-issuer", "audit-checkpoint", "ca-g1-root-01010101"]) == {"api-issuer": _sha(legacy)}
        with pytest.raises(KeyStoreError, match=r"several keys without a deployment marker .* labelled policy-signing"):
            ks.adoptable(["api-issuer", "policy-signing"])

        with sqlite_db.engine.begin() as conn:  # what the first start of this version records (workflows/adoption.py)
            conn.execute(insert(ADOPTED).values(key_id="api-issuer", spki_sha256=_sha(legacy), adopted_at=now))
            conn.execute(update(TABLE).values(adopted_at=now))
        assert not ks.adopts_unmarked() and ks.unmarked_in_use() == {"api-issuer"}
        assert _point(ks, "api-issuer") == _der_octet_string(legacy)
        assert ks.adoptable(["api-issuer"]) == {"api-issuer": _sha(legacy)}  # (what it adopted: it reads the same)

        planted = _raw_pair(ks, "ca-g2-root-02020202", None)  # under a label it had no key of when it adopted
        assert not ks.exists("ca-g2-root-02020202")
        with pytest.raises(KeyNotFound, match=r"holds one without a deployment marker .* that this deployment did "
                                              r"not adopt .* at .*, and never uses"):
            ks.get("ca-g2-root-02020202")
        ks.generate("ca-g2-root-02020202", KeyKind.EC_P256)  # no KeyExists: a key of its own, marked
        assert _point(ks, "ca-g2-root-02020202") != _der_octet_string(planted)

        for obj in ks._session.get_objects({Attribute.LABEL: "api-issuer"}):  # the adopted key swapped for another
            obj.destroy()
        _raw_pair(ks, "api-issuer", None)
        assert not ks.exists("api-issuer") and ks.unmarked_in_use() == set()
        with pytest.raises(KeyNotFound, match=r"the key without a deployment marker it adopted at .* \(public key "
                                              r"SHA-256 [0-9a-f]{64}\) is missing; the token holds another one"):
            ks.get("api-issuer")
        with pytest.raises(KeyNotFound):
            ks.delete("api-issuer")
        for obj in ks._session.get_objects({Attribute.LABEL: "api-issuer"}):  # and gone
            obj.destroy()
        with pytest.raises(KeyNotFound, match=r"adopted at .* is missing from the token$"):
            ks.get("api-issuer")
        ks.generate("api-issuer", KeyKind.EC_P256)  # as for a deployment made with markers: one of its own
        assert ks.key_owners()["api-issuer"] == MINE
    finally:
        ks.close()
