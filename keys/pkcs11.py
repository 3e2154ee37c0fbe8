"""PKCS#11 key store: keys are generated inside the token (sensitive, non-extractable) and every
signature is computed by the token. Tested against SoftHSM2.

`private_key()` returns a subclass of cryptography's private-key ABCs whose `sign` calls the token,
so `x509.CertificateBuilder.sign`, CRL builders and pyjwt work unchanged (checked with cryptography 50).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pkcs11
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, utils
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_named_curve_parameters

from keys.adoption import Adoption, read_adoptions, spki_sha256
from keys.deployment import (
    committed_marker,
    marked_committed,
    marker,
    marker_owner,
    pair_marker,
    read_deployment,
)
from keys.errors import KeyExists, KeyNotFound, KeyStoreError
from keys.store import KeyKind, PrivateKey, PublicKey, Signer, check_key_id, curve_for, hash_for
from keys.undo import discard_on_rollback

if TYPE_CHECKING:
    from store.db import Database

MASTER_WRAP_LABEL = "trustfabric-master-wrap"  # the AES key that wraps a file key store's master key
_CURVE_NAMES = {KeyKind.EC_P256: "secp256r1", KeyKind.EC_P384: "secp384r1"}
_ED25519_OID = "1.3.101.112"


def _der_octet_string(der: bytes) -> bytes:
    """The content of a DER OCTET STRING (how tokens return CKA_EC_POINT)."""
    if len(der) < 2 or der[0] != 0x04:
        raise KeyStoreError("token returned an EC point that is not a DER OCTET STRING")
    length, offset = der[1], 2
    if length & 0x80:
        n = length & 0x7F
        length, offset = int.from_bytes(der[2:2 + n], "big"), 2 + n
    if offset + length != len(der):
        raise KeyStoreError("token returned a malformed EC point")
    return der[offset:]


def _cka_id(obj: Any) -> bytes:
    """An object's CKA_ID; empty when it has none or it cannot be read."""
    try:
        return bytes(obj[Attribute.ID])
    except pkcs11.exceptions.PKCS11Error:
        return b""


def _ec_params(kind: KeyKind) -> bytes:
    return bytes(encode_named_curve_parameters(_CURVE_NAMES[kind]))


class _TokenEcKey(ec.EllipticCurvePrivateKey):
    """An EC private key whose `sign` runs in the token; it cannot be serialised or exchanged."""

    def __init__(self, signer: Pkcs11Signer, public: ec.EllipticCurvePublicKey) -> None:
        self._signer = signer
        self._public = public

    def sign(self, data: Any, signature_algorithm: ec.EllipticCurveSignatureAlgorithm) -> bytes:
        if not isinstance(signature_algorithm, ec.ECDSA):
            raise TypeError("only ECDSA signatures are supported by token keys")
        algo = signature_algorithm.algorithm
        if isinstance(algo, utils.Prehashed):
            digest = bytes(data)
        else:
            h = hashes.Hash(algo)
            h.update(bytes(data))
            digest = h.finalize()
        return self._signer.sign_digest(digest)

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._public

    @property
    def curve(self) -> ec.EllipticCurve:
        return self._public.curve

    @property
    def key_size(self) -> int:
        return self._public.key_size

    def exchange(self, algorithm: ec.ECDH, peer_public_key: ec.EllipticCurvePublicKey) -> bytes:
        raise TypeError("ECDH is not offered by token signing keys")

    def private_numbers(self) -> ec.EllipticCurvePrivateNumbers:
        raise TypeError("token keys are non-extractable")

    def private_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        raise TypeError("token keys are non-extractable")

    def __copy__(self) -> _TokenEcKey:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _TokenEcKey:
        return self


class _TokenEd25519Key(ed25519.Ed25519PrivateKey):
    """An Ed25519 private key whose `sign` runs in the token."""

    def __init__(self, signer: Pkcs11Signer, public: ed25519.Ed25519PublicKey) -> None:
        self._signer = signer
        self._public = public

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        return self._signer.sign(bytes(data))

    def public_key(self) -> ed25519.Ed25519PublicKey:
        return self._public

    def private_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        raise TypeError("token keys are non-extractable")

    def private_bytes_raw(self) -> bytes:
        raise TypeError("token keys are non-extractable")

    def __copy__(self) -> _TokenEd25519Key:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _TokenEd25519Key:
        return self


class Pkcs11Signer:
    """A token-resident key pair; the private object never leaves the token."""

    def __init__(self, store: Pkcs11KeyStore, key_id: str, kind: KeyKind, handle: Any, public: PublicKey):
        self._store = store
        self._key_id = key_id
        self._kind = kind
        self._handle = handle
        self._public = public

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def kind(self) -> KeyKind:
        return self._kind

    @property
    def handle(self) -> Any:
        """The PKCS#11 private-key object (for attribute checks in tests)."""
        return self._handle

    def public_key(self) -> PublicKey:
        return self._public

    def sign_digest(self, digest: bytes) -> bytes:
        """ECDSA over a digest computed here (SoftHSM lacks CKM_ECDSA_SHA*); returns DER, verified (_checked)."""
        with self._store.lock:
            raw = bytes(self._handle.sign(digest, mechanism=Mechanism.ECDSA))
        half = len(raw) // 2
        der = utils.encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))
        public = self._public
        assert isinstance(public, ec.EllipticCurvePublicKey)
        algo = hash_for(self._kind)
        assert algo is not None
        return self._checked(der, lambda: public.verify(der, digest, ec.ECDSA(utils.Prehashed(algo))))

    def sign(self, data: bytes) -> bytes:
        if self._kind is KeyKind.ED25519:
            with self._store.lock:
                sig = bytes(self._handle.sign(data, mechanism=Mechanism.EDDSA))
            public = self._public
            assert isinstance(public, ed25519.Ed25519PublicKey)
            return self._checked(sig, lambda: public.verify(sig, data))
        algo = hash_for(self._kind)
        assert algo is not None
        digest = hashlib.new(algo.name, data).digest()
        return self.sign_digest(digest)

    def _checked(self, signature: bytes, verify: Callable[[], None]) -> bytes:
        """`signature`, once it verifies under the public object's key, which is what lookups compare (a CA's
        certificate, an adopted key's hash, keys/adoption.py) and what verifiers trust. Why: whoever can write to the
        token can replace a pair's private object alone (its CKA_ID copied); the token then signs with their key, and
        every token, checkpoint or certificate signed would verify under no key we publish, silently. Refused
        (KeyStoreError): fail closed, nothing signed is returned."""
        try:
            verify()
        except InvalidSignature:
            raise KeyStoreError(
                f"PKCS#11 token {self._store.token_label!r}: a signature of key {self._key_id!r} does not verify under "
                "its public key: the token's private object is not the pair of its public one (replaced, or "
                "planted); nothing is signed with it until an operator restores the key") from None
        return signature

    def private_key(self) -> PrivateKey:
        if isinstance(self._public, ed25519.Ed25519PublicKey):
            return _TokenEd25519Key(self, self._public)
        return _TokenEcKey(self, self._public)

    def __repr__(self) -> str:
        return f"Pkcs11Signer(key_id={self._key_id!r}, kind={self._kind.value})"


class Pkcs11KeyStore:
    """Keys in one PKCS#11 token, found by label (= key id); one logged-in session, serialised by a lock.

    Several deployments may share a token, and some labels are fixed (audit-checkpoint, api-issuer): among the objects
    of a label, every lookup (get, exists, generate's KeyExists check, delete, key_owners) takes the one carrying this
    deployment's marker, else an unmarked one only for a deployment whose keys predate markers (origin `upgrade`,
    keys/deployment.py) and, once it recorded the unmarked keys it adopts (keys/adoption.py), only the one whose public
    key is the one adopted under its label; never one another deployment's marker names, and never an unmarked one for
    a deployment init made with markers (a key planted before its first init is not adopted: KeyNotFound, naming it).
    So a second deployment makes and signs with keys of its own beside the first's, and never signs its audit
    checkpoints or API tokens with another deployment's key.

    With `db` (what a server opens), a key generated while this thread has a write transaction open on it (a CA
    rotation's, init's) is destroyed in the token, private and public object, if that transaction rolls back, and
    kept once it commits (keys/undo.py, the rule the shared file store follows): a rotation that fails after making
    its keys leaves no orphan private key in the HSM. With `db`, too, each key pair generated is marked (CKA_ID) with
    the database's deployment id once init has written one (keys/deployment.py): what a process killed between
    making a key and committing the CA row that names it leaves, a start finds as its own and destroys
    (workflows/init.py), and never a key another deployment sharing the token made."""

    def __init__(self, module_path: str, token_label: str, pin: str, *, db: Database | None = None) -> None:
        try:
            lib = pkcs11.lib(module_path)
            token = lib.get_token(token_label=token_label)
            self._session = token.open(user_pin=pin, rw=True)
        except pkcs11.exceptions.NoSuchToken:
            raise KeyStoreError(f"no PKCS#11 token labelled {token_label!r} in {module_path}") from None
        except pkcs11.exceptions.PinIncorrect:
            raise KeyStoreError(f"wrong PIN for PKCS#11 token {token_label!r}") from None
        except (OSError, RuntimeError, pkcs11.exceptions.PKCS11Error) as exc:
            raise KeyStoreError(f"cannot open PKCS#11 token {token_label!r} via {module_path}: {exc!r}") from None
        self.token_label = token_label
        self.lock = threading.RLock()
        self._db = db
        self._deployment: str | None = None  # db's deployment id, read at the first lookup that finds it
        self._adopts = True  # whether any unmarked key may be used (no db, no deployment row yet: as before markers)
        self._adopted: dict[str, Adoption] = {}  # else only these (an upgraded deployment's, keys/adoption.py)
        self._adopted_at: datetime | None = None  # when it recorded them; None: never (made with markers) or not yet
        self._settled = False  # whether the deployment row read says all of that for good (re-read until then)

    def __repr__(self) -> str:
        return f"Pkcs11KeyStore(token={self.token_label!r})"

    def close(self) -> None:
        """Log out and close the session."""
        with self.lock:
            self._session.close()

    def unwrap_master(self, path: Path) -> bytes:
        """The 32-byte master key of a file key store, kept in `path` encrypted (AES-256-CBC) under an AES key
        that lives in this token and never leaves it (made on first use, with the master key). Without the
        token the file is useless; a wrong token or a damaged file fails the file store's master check."""
        with self.lock:
            wrapping: Any = self._find(MASTER_WRAP_LABEL, ObjectClass.SECRET_KEY)
            if wrapping is None:
                if path.exists():
                    raise KeyStoreError(f"{path} is wrapped under a key this token does not hold "
                                        f"({MASTER_WRAP_LABEL!r})")
                wrapping = self._session.generate_key(
                    KeyType.AES, 256, label=MASTER_WRAP_LABEL, store=True,
                    template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False, Attribute.TOKEN: True},
                )
            if not path.exists():
                master, iv = os.urandom(32), os.urandom(16)
                blob = iv + bytes(wrapping.encrypt(master, mechanism=Mechanism.AES_CBC_PAD, mechanism_param=iv))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, blob)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            blob = path.read_bytes()
            try:
                master = bytes(wrapping.decrypt(blob[16:], mechanism=Mechanism.AES_CBC_PAD, mechanism_param=blob[:16]))
            except pkcs11.exceptions.PKCS11Error as exc:
                raise KeyStoreError(f"{path} does not unwrap with the token's key: {exc!r}") from None
            if len(master) != 32:
                raise KeyStoreError(f"{path} does not hold a 32-byte master key")
            return master

    def _find(self, key_id: str, cls: ObjectClass) -> Any | None:
        """The object of class `cls` labelled `key_id` this deployment uses (_pick), or None."""
        return self._pick(key_id, list(self._session.get_objects({Attribute.LABEL: key_id, Attribute.CLASS: cls})))

    def _pick(self, key_id: str, found: list[Any]) -> Any | None:
        """Among objects labelled `key_id` (of one class), the one this deployment uses: the one carrying its marker;
        else, for a deployment whose keys predate markers, an unmarked one (used as before); never one another
        deployment's marker names, so that deployments sharing a token each make and use keys of their own under the
        fixed labels (audit-checkpoint, api-issuer); never an unmarked one for a deployment born with markers, and for
        an upgraded one that recorded what it adopts only the one whose public key it adopted under `key_id`.
        KeyStoreError when two qualify."""
        mine = self._mine()
        ours, unmarked = [], []
        for obj in found:
            owner = marker_owner(_cka_id(obj), key_id)
            if owner is None:
                unmarked.append(obj)
            elif owner == mine:
                ours.append(obj)
        chosen = ours or self._usable_unmarked(key_id, unmarked)
        if len(chosen) > 1:
            whose = "marked as this deployment's" if ours else "without a deployment marker"
            raise KeyStoreError(f"token holds {len(chosen)} objects labelled {key_id!r} {whose}; expected one")
        return chosen[0] if chosen else None

    def _usable_unmarked(self, key_id: str, unmarked: list[Any]) -> list[Any]:
        """Those of the unmarked objects labelled `key_id` this deployment may use: all of them before markers (or
        before an upgraded deployment's adoption), none for one made with markers, else the one(s) whose public key
        is the one it adopted under `key_id`."""
        if self._adopts or not unmarked:
            return unmarked if self._adopts else []
        adopted = self._adopted.get(key_id)
        if adopted is None:
            return []
        return [o for o in unmarked if self._digest_of(key_id, o) == adopted.spki_sha256]

    def _digest_of(self, key_id: str, obj: Any) -> str | None:
        """keys/adoption.py spki_sha256 of an unmarked object's public key: a public object's own, a private one's
        pair's (the one unmarked public object of the label with its CKA_ID); None when that pair cannot be told (no
        such public object, or several) or its key is of a type this project does not use."""
        pub = obj
        if obj.object_class != ObjectClass.PUBLIC_KEY:
            cka_id = pair_marker(_cka_id(obj))
            objs = self._session.get_objects({Attribute.LABEL: key_id, Attribute.CLASS: ObjectClass.PUBLIC_KEY})
            pubs = [o for o in objs if marker_owner(_cka_id(o), key_id) is None and pair_marker(_cka_id(o)) == cka_id]
            if len(pubs) != 1:
                return None
            pub = pubs[0]
        try:
            return spki_sha256(self._public_from(pub, self._kind_of(pub)))
        except (KeyStoreError, ValueError, pkcs11.exceptions.PKCS11Error):
            return None

    def _mine(self) -> str | None:
        """db's deployment id, or None (no `db`, or a database init has not given a deployment id yet); reads, with
        it, which unmarked keys this deployment may use (keys/adoption.py). Read again at each lookup until the row
        says so for good: an upgraded deployment's first start records its adoptions after its first lookups."""
        if not self._settled and self._db is not None:
            with self._db.statement() as conn:  # committed by init before it makes any key; a read of its own
                row = read_deployment(conn)
                adopted = read_adoptions(conn) if row is not None and row.adopted else {}  # (committed with the row)
            if row is not None:
                self._deployment, self._adopts = row.deployment_id, row.adopts_any_unmarked
                self._adopted, self._adopted_at = adopted, row.adopted_at if row.adopted else None
                self._settled = not self._adopts
        return self._deployment

    def adopts_unmarked(self) -> bool:
        """Whether a lookup may take any unmarked key of a label this deployment has no marked key of: without `db`
        or a deployment row (as before markers), or for a deployment whose keys predate markers until it recorded the
        unmarked keys it adopts; never for one init made with markers, nor once an upgraded one recorded them (it
        takes only those: unmarked_in_use)."""
        with self.lock:
            self._mine()
            return self._adopts

    def unmarked_in_use(self) -> set[str]:
        """The key ids (labels) whose key this deployment uses is an unmarked one: any, before markers or an upgraded
        deployment's adoption; an adopted one whose public key is the one recorded, after it; none for a deployment
        made with markers."""
        used = set()
        with self.lock:
            for key_id, owner in self.key_owners().items():
                if owner is not None:
                    continue
                try:
                    priv = self._find(key_id, ObjectClass.PRIVATE_KEY)
                except KeyStoreError:  # several qualify: none is used
                    continue
                if priv is not None and marker_owner(_cka_id(priv), key_id) is None:
                    used.add(key_id)
        return used

    def adoptable(self, key_ids: Iterable[str]) -> dict[str, str]:
        """Of `key_ids`, those this deployment has no marked key of and the token holds one unmarked private key of,
        with its pair's public object: each with keys/adoption.py spki_sha256 of that public key. What an upgraded
        deployment's first start adopts (workflows/adoption.py). KeyStoreError naming the labels of which the token
        holds several unmarked keys (or one with several public objects): which one is this deployment's cannot be
        told, so none is adopted and nothing is written."""
        found: dict[str, str] = {}
        several = []
        with self.lock:
            mine = self._mine()
            for key_id in sorted(set(key_ids)):
                check_key_id(key_id)
                objs = list(self._session.get_objects({Attribute.LABEL: key_id,
                                                       Attribute.CLASS: ObjectClass.PRIVATE_KEY}))
                owners = [marker_owner(_cka_id(o), key_id) for o in objs]
                unmarked = [o for o, owner in zip(objs, owners, strict=True) if owner is None]
                if (mine is not None and mine in owners) or not unmarked:
                    continue  # its own marked key is the one it uses; or nothing to adopt
                digest = self._digest_of(key_id, unmarked[0]) if len(unmarked) == 1 else None
                if digest is None:
                    several.append(key_id)
                else:
                    found[key_id] = digest
        if several:
            raise KeyStoreError(
                f"PKCS#11 token {self.token_label!r} holds several keys without a deployment marker (or one without a "
                f"single public object) labelled {', '.join(several)}: which one this deployment used before markers "
                "cannot be told, so it adopts none; remove those that are not its own (pkcs11-tool --list-objects) "
                "and start again")
        return found

    def _refusal(self, key_id: str) -> str | None:
        """Why a lookup of `key_id` found no key although the token holds an unmarked one of that label, or although
        this deployment adopted one; None when neither."""
        if self._adopts:
            return None
        head = f"no key {key_id!r} of this deployment in PKCS#11 token {self.token_label!r}"
        objs = self._session.get_objects({Attribute.LABEL: key_id, Attribute.CLASS: ObjectClass.PRIVATE_KEY})
        unmarked = any(marker_owner(_cka_id(o), key_id) is None for o in objs)
        adopted = self._adopted.get(key_id)
        if adopted is not None:
            which = (f"the key without a deployment marker it adopted at {adopted.adopted_at.isoformat()} (public key "
                     f"SHA-256 {adopted.spki_sha256})")
            if unmarked:
                return (f"{head}: {which} is missing; the token holds another one without a marker under that label "
                        "(swapped in, or planted, or without its public object), which this deployment never uses")
            return f"{head}: {which} is missing from the token"
        if not unmarked:
            return None
        if self._adopted_at is not None:
            return (f"{head}: the token holds one without a deployment marker (made by other software, or planted) "
                    "that this deployment did not adopt when it recorded the unmarked keys it uses, at "
                    f"{self._adopted_at.isoformat()}, and never uses")
        return (f"{head}: the token holds one without a deployment marker (made by other software, or planted), which "
                "a deployment made with markers never uses")

    def _marker(self, key_id: str) -> bytes | None:
        """The CKA_ID a key pair `key_id` generated now gets: its deployment's marker, or None (no deployment id: the
        key stays unmarked, and is never removed automatically)."""
        mine = self._mine()
        return None if mine is None else marker(mine, key_id)

    def generate(self, key_id: str, kind: KeyKind) -> Signer:
        """Create a key inside the token; an existing key_id is KeyExists, never overwritten silently. Inside a
        write transaction on `db`, destroyed again if it rolls back; marked with db's deployment id."""
        check_key_id(key_id)
        kind = KeyKind(kind)
        with self.lock:
            cka_id = self._marker(key_id)
            if self._find(key_id, ObjectClass.PRIVATE_KEY) is not None:
                raise KeyExists(f"key {key_id!r} exists already in token {self.token_label!r}")
            private_template = {
                Attribute.TOKEN: True,
                Attribute.PRIVATE: True,
                Attribute.SENSITIVE: True,
                Attribute.EXTRACTABLE: False,
                Attribute.SIGN: True,
            }
            public_template = {Attribute.TOKEN: True, Attribute.VERIFY: True}
            if kind is KeyKind.ED25519:
                params = self._session.create_domain_parameters(
                    KeyType.EC_EDWARDS,
                    {Attribute.EC_PARAMS: bytes(encode_named_curve_parameters(_ED25519_OID))},
                    local=True,
                )
                mech = Mechanism.EC_EDWARDS_KEY_PAIR_GEN
            else:
                params = self._session.create_domain_parameters(
                    KeyType.EC, {Attribute.EC_PARAMS: _ec_params(kind)}, local=True
                )
                mech = Mechanism.EC_KEY_PAIR_GEN
            pub, priv = params.generate_keypair(
                id=cka_id,
                store=True,
                label=key_id,
                mechanism=mech,
                public_template=public_template,
                private_template=private_template,
            )
            if self._db is not None:
                discard_on_rollback(self._db, key_id, self, irreversible=True)
            return Pkcs11Signer(self, key_id, kind, priv, self._public_from(pub, kind))

    @staticmethod
    def _public_from(pub: Any, kind: KeyKind) -> PublicKey:
        point = _der_octet_string(bytes(pub[Attribute.EC_POINT]))
        if kind is KeyKind.ED25519:
            return ed25519.Ed25519PublicKey.from_public_bytes(point)
        return ec.EllipticCurvePublicKey.from_encoded_point(curve_for(kind), point)

    def _kind_of(self, pub: Any) -> KeyKind:
        key_type = pub[Attribute.KEY_TYPE]
        if key_type == KeyType.EC_EDWARDS:
            return KeyKind.ED25519
        if key_type == KeyType.EC:
            params = bytes(pub[Attribute.EC_PARAMS])
            for kind in (KeyKind.EC_P256, KeyKind.EC_P384):
                if params == _ec_params(kind):
                    return kind
        raise KeyStoreError(f"token key has a type this project does not use ({key_type!r})")

    def get(self, key_id: str) -> Signer:
        """The key, or KeyNotFound."""
        check_key_id(key_id)
        with self.lock:
            priv = self._find(key_id, ObjectClass.PRIVATE_KEY)
            pub = None if priv is None else self._pair_of(key_id, priv, ObjectClass.PUBLIC_KEY)
            refusal = self._refusal(key_id) if priv is None else None
            if refusal is not None:
                raise KeyNotFound(refusal)
            if priv is None or pub is None:
                raise KeyNotFound(f"no key {key_id!r} in PKCS#11 token {self.token_label!r}")
            kind = self._kind_of(pub)
            return Pkcs11Signer(self, key_id, kind, priv, self._public_from(pub, kind))

    def exists(self, key_id: str) -> bool:
        """Whether a key with this id is held."""
        check_key_id(key_id)
        with self.lock:
            return self._find(key_id, ObjectClass.PRIVATE_KEY) is not None

    def _pair_of(self, key_id: str, priv: Any, cls: ObjectClass) -> Any | None:
        """The object of class `cls` labelled `key_id` with the CKA_ID of `priv` (its pair; the committed mark aside,
        which one of them may have and the other not yet), or None."""
        cka_id = pair_marker(_cka_id(priv))
        objs = self._session.get_objects({Attribute.LABEL: key_id, Attribute.CLASS: cls})
        return self._pick(key_id, [o for o in objs if pair_marker(_cka_id(o)) == cka_id])

    def delete(self, key_id: str) -> None:
        """Destroy the key pair this deployment uses under `key_id` (its own, else an unmarked one; never another
        deployment's); KeyNotFound when there is none."""
        check_key_id(key_id)
        with self.lock:
            priv = self._find(key_id, ObjectClass.PRIVATE_KEY)
            if priv is None:
                raise KeyNotFound(f"no key {key_id!r} in PKCS#11 token {self.token_label!r}")
            cka_id = pair_marker(_cka_id(priv))
            objs = self._session.get_objects({Attribute.LABEL: key_id})
            for obj in [o for o in objs if pair_marker(_cka_id(o)) == cka_id]:
                obj.destroy()

    def key_owners(self) -> dict[str, str | None]:
        """Every private key in the token, by label (key id), with the deployment id the marker of the key this
        deployment would use under that label names (get's rule: its own, else an unmarked one); None: no marker
        (made before markers existed, or by other software). A label only other deployments' keys carry names one of
        them (the least id, when several)."""
        found: dict[str, list[str | None]] = {}
        with self.lock:
            for obj in self._session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY}):
                try:
                    label, cka_id = obj[Attribute.LABEL], bytes(obj[Attribute.ID])
                except pkcs11.exceptions.PKCS11Error:  # an object whose label or id cannot be read: nobody's
                    continue
                if not isinstance(label, str) or not label:
                    continue
                found.setdefault(label, []).append(marker_owner(cka_id, label))
            mine = self._mine()
        owners: dict[str, str | None] = {}
        for label, marks in found.items():
            if mine is not None and mine in marks:
                owners[label] = mine
            elif None in marks:
                owners[label] = None
            else:
                owners[label] = min(m for m in marks if m is not None)
        return owners

    def committed_ids(self) -> set[str]:
        """The ids of this deployment's private keys whose marker says a committed CA row named them (mark_committed);
        empty without a deployment id."""
        with self.lock:
            mine = self._mine()
            if mine is None:
                return set()
            committed = set()
            for obj in self._session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY}):
                try:
                    label, cka_id = obj[Attribute.LABEL], bytes(obj[Attribute.ID])
                except pkcs11.exceptions.PKCS11Error:
                    continue
                if isinstance(label, str) and marked_committed(cka_id, label) and marker_owner(cka_id, label) == mine:
                    committed.add(label)
            return committed

    def mark_committed(self, key_id: str) -> bool:
        """Mark this deployment's key pair `key_id` as named by a committed CA row (keys/deployment.py): its CKA_ID
        becomes the committed marker, private object first (what committed_ids and destroy_marked read), then the
        public one. Whether anything changed; False too for a key that is not this deployment's (unmarked: never
        claimed). Call it only after the transaction committing the CA rows that name the key has committed."""
        check_key_id(key_id)
        with self.lock:
            mine = self._mine()
            if mine is None:
                return False
            plain, done = marker(mine, key_id), committed_marker(mine, key_id)
            objs = list(self._session.get_objects({Attribute.LABEL: key_id, Attribute.ID: plain}))
            objs.sort(key=lambda o: o.object_class != ObjectClass.PRIVATE_KEY)  # the private object first
            for obj in objs:
                obj[Attribute.ID] = done
            return bool(objs)

    def destroy_marked(self, key_id: str, deployment_id: str) -> bool:
        """Destroy the key pair `key_id` if marked as made by `deployment_id`, its private and public object; whether
        it was. Objects of that label without that marker (another deployment's, unmarked) are left, and so is a pair
        whose private object the token says was committed (mark_committed): its marker is not the one looked for."""
        check_key_id(key_id)
        with self.lock:
            template = {Attribute.LABEL: key_id, Attribute.ID: marker(deployment_id, key_id)}
            objs = list(self._session.get_objects(template))
            if not any(o.object_class == ObjectClass.PRIVATE_KEY for o in objs):
                return False
            for obj in objs:
                obj.destroy()
            return True
