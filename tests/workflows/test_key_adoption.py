"""An upgraded deployment (keys made before markers) records the unmarked keys it adopts at its first start, and uses
no other unmarked key from then on (keys/adoption.py): real SoftHSM2, real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters
from sqlmodel import col, select

from audit.checkpoint import AUDIT_KEY_ID, audit_signer, load_public_key, public_key_pem, write_checkpoint
from audit.errors import VerificationError
from audit.models import AuditCheckpoint, AuditEvent
from audit.verify import verify_export
from keys.adoption import spki_sha256
from keys.errors import KeyNotFound, KeyStoreError
from keys.pkcs11 import Pkcs11KeyStore
from keys.store import KeyKind
from pki.errors import ForeignKeyStore
from pki.models import CertificateAuthority
from pki.tokens.service import API_ISSUER_KEY_ID
from store.db import Database, sqlite_url
from tests.keys.stores import _LIST_OBJECTS, PIN
from tests.workflows.conftest import Token
from tests.workflows.test_token_keys import (
    _as_b,
    _audit_verifies,
    _close,
    _env,
    _named,
    _open,
    _public_pem,
    _replicas_at_once,
    _signs,
    wait_for_the_other_replicas,
)
from tests.workflows.test_token_witness import _export, _planted, made_before_markers
from workflows.adoption import adopt_unmarked_keys
from workflows.context import AppContext
from workflows.init import initialize, token_keys

pytestmark = pytest.mark.hsm
BACKENDS = pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])


def _adopted(ctx: AppContext) -> dict[str, str]:
    """The adopted_keys rows: key id -> public key SHA-256."""
    with ctx.db.statement() as conn:
        return {str(k): str(d) for k, d in conn.exec_driver_sql("SELECT key_id, spki_sha256 FROM adopted_keys")}


def _adopt_events(ctx: AppContext) -> list[dict[str, Any]]:
    with ctx.db.read_session() as s:
        events = s.exec(select(AuditEvent).where(AuditEvent.action == "deployment.adopt").order_by(
            col(AuditEvent.seq))).all()
    return [dict(e.summary or {}) for e in events]


def _uses(ctx: AppContext) -> dict[str, str]:
    """The public keys (PEM) the deployment signs its audit checkpoints and its API tokens with."""
    return {"audit": public_key_pem(audit_signer(ctx.keystore)), "issuer": _public_pem(ctx, API_ISSUER_KEY_ID)}


def _sha_of(ctx: AppContext, key_id: str) -> str:
    return spki_sha256(ctx.keystore.get(key_id).public_key())


def _destroy(ks: Pkcs11KeyStore, key_id: str) -> None:
    """Both objects of every key pair labelled `key_id`, as someone with access to the token removes them."""
    for obj in ks._session.get_objects({Attribute.LABEL: key_id}):
        obj.destroy()


@BACKENDS
def test_an_upgraded_deployment_adopts_its_unmarked_keys_at_its_first_start_and_keeps_using_them(
        backend: str, token: Token, deployments: list[AppContext], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    home = tmp_path / "a"
    url, old_audit, old_issuer = made_before_markers(request, backend, home, token)
    a = _open(home, url, token, deployments)
    assert initialize(a, None, "ec-p256")["created"] is False
    used = _named(a) | {AUDIT_KEY_ID, API_ISSUER_KEY_ID}
    adopted = _adopted(a)
    assert adopted == {k: _sha_of(a, k) for k in used} and len(adopted) == 5  # root, issuing, JWT, audit, issuer
    events = _adopt_events(a)
    assert len(events) == 1 and events[0]["adopted"] == adopted
    assert _uses(a) == {"audit": old_audit, "issuer": old_issuer}
    assert {r["marker"] for r in token_keys(a)} == {f"unmarked, adopted at {a.clock().isoformat()}"}
    _signs(a)
    _close(a)
    deployments.remove(a)
    again = _open(home, url, token, deployments)  # the next start: its keys still, nothing adopted again
    assert initialize(again, None, "ec-p256")["created"] is False
    assert _adopted(again) == adopted and len(_adopt_events(again)) == 1
    assert _uses(again) == {"audit": old_audit, "issuer": old_issuer}
    _signs(again)
    assert _audit_verifies(again) > 3


@BACKENDS
def test_after_its_adoption_an_upgraded_deployment_never_uses_an_unmarked_key_planted_or_swapped_in(
        backend: str, token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: an upgraded deployment used an unmarked key of a label whenever it had no marked one, for ever and
    for any label. So with its API issuer key removed and another unmarked one put in its place, its next start
    signed API tokens with the planted key (whoever planted it could mint admin tokens); an unmarked key under a CA
    key id it looks up for the first time was taken for its own; and a second unmarked audit key swapped in for the
    adopted one signed its checkpoints. Now it takes only the unmarked keys it adopted at its first start."""
    home = tmp_path / "a"
    url, old_audit, old_issuer = made_before_markers(request, backend, home, token)
    a = _open(home, url, token, deployments)
    assert initialize(a, None, "ec-p256")["created"] is False  # adopts
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)

    planted_ca = _planted(ks, "ca-g7-root-07070707", KeyKind.EC_P256)  # a CA key id it has no key of yet
    assert not ks.exists("ca-g7-root-07070707")
    ks.generate("ca-g7-root-07070707", KeyKind.EC_P256)  # as a rotation makes it: its own, beside the planted one
    assert _public_pem(a, "ca-g7-root-07070707") != planted_ca

    _destroy(ks, API_ISSUER_KEY_ID)  # the adopted API issuer key removed, another unmarked one put in its place
    planted_issuer = _planted(ks, API_ISSUER_KEY_ID, KeyKind.EC_P256)
    _destroy(ks, AUDIT_KEY_ID)  # and the audit key swapped for another unmarked one
    planted_audit = _planted(ks, AUDIT_KEY_ID, KeyKind.ED25519)
    with pytest.raises(KeyNotFound, match=r"'audit-checkpoint' of this deployment .*: the key without a deployment "
                                        r"marker it adopted at .* is missing; the token holds another one"):
        ks.get(AUDIT_KEY_ID)
    caplog.set_level(logging.WARNING)
    caplog.clear()
    assert initialize(a, None, "ec-p256")["created"] is False  # the next start: keys of its own, marked
    ours = _uses(a)
    assert ours["issuer"] not in (planted_issuer, old_issuer) and ours["audit"] not in (planted_audit, old_audit)
    assert ks.key_owners()[API_ISSUER_KEY_ID] == ks.key_owners()[AUDIT_KEY_ID] is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.adoption"]
    assert len(lines) == 1 and "missing from the token, or another key without a marker is in their place" in (
        lines[0]) and f"{API_ISSUER_KEY_ID} (adopted at " in lines[0] and f"{AUDIT_KEY_ID} (adopted at " in lines[0]
    out = _export(a)
    with pytest.raises(VerificationError):  # its checkpoints are never signed with the planted key
        verify_export(out, load_public_key(planted_audit))
    rows = {r["key_id"]: r["marker"] for r in token_keys(a)}
    assert rows[API_ISSUER_KEY_ID] == rows[AUDIT_KEY_ID] == "this deployment"
    assert rows["ca-g7-root-07070707"] == "this deployment"
    _signs(a)  # its CA keys, adopted, sign on

    issuing = next(k for k in _named(a) if "-issuing-" in k)  # an adopted CA key swapped: refused, and said so
    _destroy(ks, issuing)
    _planted(ks, issuing, KeyKind.EC_P256)
    assert {r["key_id"]: r["marker"] for r in token_keys(a)}[issuing].startswith("unmarked, not the one adopted at ")
    with pytest.raises(ForeignKeyStore, match=rf"has no key '{issuing}' .*adopted \(made before markers\) are missing "
                                              rf"from the token, .*: {issuing} \(adopted at .*restore it to the token"):
        initialize(a, None, "ec-p256")


def b_made_with_the_shared_keys(ctx: AppContext) -> dict[str, Any]:
    """B's start (its database and its keys from before markers); what it signs with, and what it adopted."""
    assert initialize(ctx, None, "ec-p256")["created"] is False
    _signs(ctx)
    return {**_uses(ctx), "adopted": _adopted(ctx)}


@BACKENDS
def test_two_upgraded_deployments_sharing_an_unmarked_key_both_keep_using_it(
        backend: str, token: Token, deployments: list[AppContext], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """Two deployments from before markers on one token: the second's init found the first's audit and API issuer
    keys (fixed labels, no marker) and used them. Both adopt them, and neither re-marks them (which would take them
    from the other): each signs with them on, across restarts."""
    url_a, audit, issuer = made_before_markers(request, backend, tmp_path / "a", token)
    url_b, audit_b, issuer_b = made_before_markers(request, backend, tmp_path / "b", token)
    assert (audit_b, issuer_b) == (audit, issuer)  # shared, as the code before markers shared them
    a = _open(tmp_path / "a", url_a, token, deployments)
    assert initialize(a, None, "ec-p256")["created"] is False
    b = _as_b(_env(tmp_path / "b", url_b, token), "tests.workflows.test_key_adoption:b_made_with_the_shared_keys")
    assert isinstance(b, dict)
    assert (b["audit"], b["issuer"]) == (audit, issuer) == tuple(_uses(a).values())
    shared = {AUDIT_KEY_ID, API_ISSUER_KEY_ID}
    assert {k: v for k, v in b["adopted"].items() if k in shared} == {
        k: v for k, v in _adopted(a).items() if k in shared} and len(_adopted(a)) == len(b["adopted"]) == 5
    module, label = token
    listed = subprocess.run([sys.executable, "-c", _LIST_OBJECTS, module, label, PIN], capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()
    assert sorted(k for k in listed if k.startswith(tuple(shared))) == sorted(
        f"{k} {cls}" for k in shared for cls in ("PRIVATE_KEY", "PUBLIC_KEY"))  # one pair each, still shared
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    assert {bytes(o[Attribute.ID]) for k in shared for o in ks._session.get_objects({Attribute.LABEL: k})} <= {b""}
    _close(a)
    deployments.remove(a)
    again = _open(tmp_path / "a", url_a, token, deployments)
    assert initialize(again, None, "ec-p256")["created"] is False
    assert tuple(_uses(again).values()) == (audit, issuer)
    assert _as_b(_env(tmp_path / "b", url_b, token), "tests.workflows.test_key_adoption:b_made_with_the_shared_keys"
                 ) == b
    _signs(again)


def adopts_at_once(ctx: AppContext) -> dict[str, str] | None:
    """A replica's adoption, at the moment every replica is ready; its token read takes a second, so that the
    replicas' adoptions overlap (else one may be done before the next begins)."""
    read = ctx.keystore.adoptable  # type: ignore[attr-defined]

    def slowly(key_ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = read(key_ids)
        time.sleep(1)
        return found

    setattr(ctx.keystore, "adoptable", slowly)  # noqa: B010 (a method of this one store, replaced)
    wait_for_the_other_replicas()
    return adopt_unmarked_keys(ctx)


@BACKENDS
def test_replicas_starting_at_once_adopt_once(
        backend: str, token: Token, deployments: list[AppContext], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """Replicas of an upgraded deployment starting together (a rolling upgrade), each a process of its own on the
    shared database and token: one records the adoption, with one event; the others find it recorded."""
    home = tmp_path / "a"
    url, _audit, _issuer = made_before_markers(request, backend, home, token)
    a = _open(home, url, token, deployments)  # its schema steps and deployment row: what each replica's start did
    from workflows.init import ensure_deployment

    ensure_deployment(a, upgrade=True)
    _close(a)
    deployments.remove(a)
    ran = _replicas_at_once(_env(home, url, token), "tests.workflows.test_key_adoption:adopts_at_once", tmp_path)
    assert [code for code, _out, _err in ran] == [0, 0, 0], [err[-1500:] for _code, _out, err in ran]
    results = [json.loads(out.splitlines()[-1]) for _code, out, _err in ran]
    assert len([r for r in results if r is not None]) == 1, results
    again = _open(home, url, token, deployments)
    assert _adopted(again) == next(r for r in results if r is not None) and len(_adopted(again)) == 5
    assert len(_adopt_events(again)) == 1
    assert initialize(again, None, "ec-p256")["created"] is False and len(_adopt_events(again)) == 1
    _signs(again)


def test_an_upgraded_deployment_with_two_unmarked_keys_of_a_label_adopts_nothing_and_says_which(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Which of two unmarked `api-issuer` keys the deployment used before markers cannot be told: its start refuses,
    naming the label and what to do, and writes nothing (no adoption, no event); with the stray one removed, the next
    start adopts."""
    home = tmp_path / "a"
    url, _audit, issuer = made_before_markers(request, "sqlite", home, token)
    a = _open(home, url, token, deployments)
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    stray = ks._session.create_domain_parameters(  # a second unmarked pair, with a CKA_ID of its own
        KeyType.EC, {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters("secp256r1"))}, local=True)
    stray.generate_keypair(id=b"stray", label=API_ISSUER_KEY_ID, store=True, mechanism=Mechanism.EC_KEY_PAIR_GEN)
    with pytest.raises(KeyStoreError, match=r"several keys without a deployment marker .* labelled api-issuer: which "
                                            r"one .* cannot be told, so it adopts none; remove those"):
        initialize(a, None, "ec-p256")
    assert _adopted(a) == {} and _adopt_events(a) == []
    with a.db.statement() as conn:
        assert conn.exec_driver_sql("SELECT adopted_at FROM deployment").scalars().all() == [None]
    for obj in ks._session.get_objects({Attribute.LABEL: API_ISSUER_KEY_ID, Attribute.ID: b"stray"}):
        obj.destroy()
    assert initialize(a, None, "ec-p256")["created"] is False
    assert API_ISSUER_KEY_ID in _adopted(a) and _uses(a)["issuer"] == issuer and len(_adopt_events(a)) == 1


def _swap_private(ks: Pkcs11KeyStore, label: str, ed25519: bool) -> None:
    """The private object labelled `label` replaced by another key's, its CKA_ID copied, its public object left: as
    someone with write access to the token swaps the private half of an adopted (or marked) pair."""
    old = list(ks._session.get_objects({Attribute.LABEL: label, Attribute.CLASS: ObjectClass.PRIVATE_KEY}))
    assert len(old) == 1
    cka_id = bytes(old[0][Attribute.ID])
    params = ks._session.create_domain_parameters(
        KeyType.EC_EDWARDS if ed25519 else KeyType.EC,
        {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters("1.3.101.112" if ed25519 else "secp256r1"))},
        local=True)
    pub, _priv = params.generate_keypair(
        label=label, store=True, mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN if ed25519 else Mechanism.EC_KEY_PAIR_GEN,
        private_template={Attribute.SIGN: True, Attribute.TOKEN: True, Attribute.ID: cka_id},
        public_template={Attribute.VERIFY: True, Attribute.TOKEN: True, Attribute.ID: cka_id})
    pub.destroy()
    old[0].destroy()


def test_a_private_object_swapped_under_an_adopted_public_key_never_signs(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Should fix: the adoption pins the public object's key, and a lookup compares only that; the signature comes from
    the private object. With the private object of the adopted API issuer, audit and issuing CA keys swapped for
    another key's (CKA_ID copied, public object left), the deployment signed API tokens, checkpoints and SVIDs with
    it: signatures that verify under no key it publishes, silently (a stored checkpoint nobody can check). Now a
    signature that does not verify under the key's public key is refused (KeyStoreError), nothing is stored."""
    home = tmp_path / "a"
    url, _old_audit, _old_issuer = made_before_markers(request, "sqlite", home, token)
    a = _open(home, url, token, deployments)
    assert initialize(a, None, "ec-p256")["created"] is False  # adopts
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    issuing = next(k for k in _named(a) if "-issuing-" in k)
    _swap_private(ks, API_ISSUER_KEY_ID, ed25519=False)
    _swap_private(ks, AUDIT_KEY_ID, ed25519=True)
    _swap_private(ks, issuing, ed25519=False)
    with pytest.raises(KeyStoreError, match=r"does not verify under its public key"):
        ks.get(API_ISSUER_KEY_ID).sign(b"claims")
    with pytest.raises(KeyStoreError, match=r"does not verify under its public key"):
        ks.get(AUDIT_KEY_ID).sign(b"checkpoint")
    with a.db.read_session() as s:
        before = s.exec(select(AuditCheckpoint.size)).all()
    with pytest.raises(KeyStoreError):
        write_checkpoint(a.db, audit_signer(ks), clock=a.clock)
    with a.db.read_session() as s:
        assert s.exec(select(AuditCheckpoint.size)).all() == before  # no checkpoint stored with a bad signature
    with pytest.raises(KeyStoreError, match=rf"{issuing!r} .*does not verify under its public key"):
        _signs(a)


def _planted_where_the_database_tells(request: pytest.FixtureRequest, home: Path,
                                      token: Token) -> tuple[str | None, str, str]:
    """A deployment from before markers with a stored checkpoint and a retired CA generation, whose audit key was
    deleted and replaced by a planted one, and a key planted under the retired generation's key id: its URL, its
    real audit key's public key and the planted one's (PEM)."""
    url, old_audit, _old_issuer = made_before_markers(request, "sqlite", home, token)
    module, label = token
    before = Pkcs11KeyStore(module, label, PIN)  # the pre-marker code's last checkpoint, with its real audit key
    db = Database(url or sqlite_url(home))
    try:
        write_checkpoint(db, audit_signer(before))
        with db.session() as s:  # a retired generation, whose key is gone from the token
            root = s.exec(select(CertificateAuthority).where(CertificateAuthority.role == "root")).one()
            retired = CertificateAuthority(**{**root.model_dump(), "id": "g0-root", "generation": 0,
                                              "state": "retired", "key_id": "ca-g0-root-0badc0de"})
            s.add(retired)
        _destroy(before, AUDIT_KEY_ID)  # the real audit key deleted; keys planted in the token
        planted_audit = _planted(before, AUDIT_KEY_ID, KeyKind.ED25519)
        _planted(before, "ca-g0-root-0badc0de", KeyKind.EC_P256)
    finally:
        before.close()
        db.dispose()
    return url, old_audit, planted_audit


def test_the_first_start_never_adopts_a_planted_key_its_database_can_tell_is_not_its_own(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """Should fix: the first upgraded start adopted, for every label it names, whatever one unmarked key the token
    then held. Its database can tell some are not its own: a retired CA generation's key id (its key destroyed at
    retirement, say) names a certificate, whose public key a key planted under that id does not have; and the audit
    key signed the checkpoints it stores, which a key planted after the real one was deleted does not verify. Such a
    planted key was adopted (recorded, `ca keys` said `adopted`), and the planted audit key signed its checkpoints.
    Now a key that does not match what the database holds is not adopted, and the start says so."""
    home = tmp_path / "a"
    url, old_audit, planted_audit = _planted_where_the_database_tells(request, home, token)
    a = _open(home, url, token, deployments)
    caplog.set_level(logging.WARNING)
    assert initialize(a, None, "ec-p256")["created"] is False
    adopted = _adopted(a)
    assert "ca-g0-root-0badc0de" not in adopted and AUDIT_KEY_ID not in adopted and API_ISSUER_KEY_ID in adopted
    events = _adopt_events(a)
    assert len(events) == 1 and set(events[0]["refused"]) == {"ca-g0-root-0badc0de", AUDIT_KEY_ID}
    lines = [r.getMessage() for r in caplog.records if r.name == "workflows.adoption"]
    assert any("not adopted" in m and "ca-g0-root-0badc0de" in m and AUDIT_KEY_ID in m for m in lines)
    rows = {r["key_id"]: r["marker"] for r in token_keys(a)}
    assert rows["ca-g0-root-0badc0de"] == "unmarked, not adopted"
    assert public_key_pem(audit_signer(a.keystore)) not in (planted_audit, old_audit)  # a marked key of its own
    with pytest.raises(VerificationError):
        verify_export(_export(a), load_public_key(planted_audit))
    _signs(a)


def test_the_first_start_never_adopts_a_pair_whose_private_object_was_swapped(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Should fix: the adoption hashes a pair's public object only. The API issuer key's private object swapped before
    the first upgraded start (its public object left, CKA_ID copied) was adopted: the deployment then could sign no
    API token at all (its signatures refused), and the record said that pair was its key. Now a pair whose private
    object does not sign under its public key is not adopted, and the start makes a marked issuer key of its own."""
    home = tmp_path / "a"
    url, _old_audit, old_issuer = made_before_markers(request, "sqlite", home, token)
    module, label = token
    before = Pkcs11KeyStore(module, label, PIN)
    try:
        _swap_private(before, API_ISSUER_KEY_ID, ed25519=False)
    finally:
        before.close()
    a = _open(home, url, token, deployments)
    assert initialize(a, None, "ec-p256")["created"] is False
    assert API_ISSUER_KEY_ID not in _adopted(a) and AUDIT_KEY_ID in _adopted(a)
    assert "private object" in _adopt_events(a)[0]["refused"][API_ISSUER_KEY_ID]
    ks = a.keystore
    assert isinstance(ks, Pkcs11KeyStore)
    assert ks.key_owners()[API_ISSUER_KEY_ID] is not None  # its own, marked
    assert _uses(a)["issuer"] != old_issuer
    ks.get(API_ISSUER_KEY_ID).sign(b"claims")  # signs, verifiably


def test_a_start_refuses_when_a_ca_key_in_use_was_not_adopted(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Should fix: the issuing CA key's private object swapped before the first upgraded start (public object left)
    passed the start's CA key check, which compares public keys; the start then completed with that key not adopted,
    and said nothing, and every SVID issuance failed afterwards. Now that start, and every later one, refuses with
    one error naming the key and why it is not used, as for an adopted CA key gone from the token."""
    home = tmp_path / "a"
    url, _old_audit, _old_issuer = made_before_markers(request, "sqlite", home, token)
    module, label = token
    before = Pkcs11KeyStore(module, label, PIN)
    try:
        issuing = next(k for k in before.key_owners() if "-issuing-" in k)
        _swap_private(before, issuing, ed25519=False)
    finally:
        before.close()
    a = _open(home, url, token, deployments)
    refusal = rf"{issuing}.* not adopted by this deployment's first start .*never used; restore"
    with pytest.raises(ForeignKeyStore, match=refusal):
        initialize(a, None, "ec-p256")
    assert issuing not in _adopted(a) and "private object" in _adopt_events(a)[0]["refused"][issuing]
    with pytest.raises(ForeignKeyStore, match=refusal):  # the next start too
        initialize(a, None, "ec-p256")


def test_ca_keys_before_the_first_start_says_which_unmarked_keys_it_will_not_adopt(
        token: Token, deployments: list[AppContext], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Should fix: before an upgraded deployment's first start on this version, `ca keys` called every unmarked key
    `used: adopted at the next start`, those the start will refuse too (a key planted under a retired generation's
    key id, an audit key that does not verify the stored checkpoints). Now it says which it will not adopt, and why."""
    home = tmp_path / "a"
    url, _old_audit, _planted_audit = _planted_where_the_database_tells(request, home, token)
    a = _open(home, url, token, deployments)
    rows = {r["key_id"]: r["marker"] for r in token_keys(a)}
    assert rows["ca-g0-root-0badc0de"].startswith("unmarked, used until the next start, which will not adopt it: not "
                                                  "the public key of the certificate")
    assert rows[AUDIT_KEY_ID].startswith("unmarked, used until the next start, which will not adopt it: does not "
                                         "verify the stored checkpoint")
    assert rows[API_ISSUER_KEY_ID] == "unmarked, used: adopted at the next start"
