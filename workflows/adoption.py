"""An upgraded deployment records the unmarked keys it adopts (keys/adoption.py, the why): at its first start on this
version, and at every later start until that is done, before its signing keys are looked up or made."""

from __future__ import annotations

import logging

from cryptography.hazmat.primitives import serialization
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from audit import Actor, record
from audit.checkpoint import AUDIT_KEY_ID, audit_signer, ed25519_public_key, latest_checkpoint, verify_checkpoint
from audit.errors import CheckpointError
from keys.adoption import Adoption, read_adoptions, spki_sha256
from keys.deployment import ORIGIN_UPGRADE, read_deployment
from keys.errors import KeyStoreError
from keys.models import AdoptedKey, Deployment
from keys.store import KeyStore, MarkedKeyStore
from pki.ca import certificate, key_ids_in_use
from pki.models import CertificateAuthority
from pki.tokens.service import API_ISSUER_KEY_ID
from workflows.context import AppContext
from workflows.rotation import named_key_ids

_log = logging.getLogger(__name__)
FIXED = (AUDIT_KEY_ID, API_ISSUER_KEY_ID)  # the labels every deployment signs with, beside its CA keys


def adopt_unmarked_keys(ctx: AppContext) -> dict[str, str] | None:
    """For a deployment whose keys predate markers (origin `upgrade`) in a PKCS#11 token that has not yet recorded
    what it adopts: for each label it uses (the key ids its CA rows name, in any state, and the audit and API issuer
    keys) of which it has no marked key and the token holds one unmarked key, that key's label and public key hash,
    in `adopted_keys`, with `deployment.adopted_at` and one `deployment.adopt` audit event, in one transaction. The
    labels and hashes adopted; None when there was nothing to do (another key store or origin, done already, or a
    replica starting at once did it: its rows stand). Nothing is re-marked in the token: a key two pre-marker
    deployments share stays usable by both. KeyStoreError, with nothing written, when a label has several unmarked
    keys (Pkcs11KeyStore.adoptable).

    At every start of an adopted deployment after that: one warning line naming the adopted keys of the labels it
    signs with that are missing from the token, or whose place another unmarked key took (never used)."""
    keystore = ctx.keystore
    if not isinstance(keystore, MarkedKeyStore):
        return None
    with ctx.db.statement() as conn:
        row = read_deployment(conn)
    if row is None or row.origin != ORIGIN_UPGRADE:
        return None
    adopted = _adopt(ctx, keystore) if row.adopted_at is None else None
    _say_missing(ctx)
    return adopted


def _adopt(ctx: AppContext, keystore: MarkedKeyStore) -> dict[str, str] | None:
    labels = sorted({*named_key_ids(ctx), *FIXED})
    try:
        with ctx.db.session() as session:
            # Replicas starting at once take turns on the deployment row (PostgreSQL's row lock, whose FOR UPDATE
            # reads the winner's committed row; SQLite's writer lock, taken by BEGIN IMMEDIATE): the first records,
            # the others find adopted_at set and record nothing. The rows' primary key holds it should that fail.
            deployment = session.exec(select(Deployment).where(col(Deployment.id) == 1).with_for_update()).one()
            if deployment.adopted_at is not None:
                return None
            found = keystore.adoptable(labels)  # the token read under the lock: what every replica would find
            refused = unlike_database(session, ctx.keystore, found)
            found = {k: d for k, d in found.items() if k not in refused}
            now = ctx.clock()
            for key_id, digest in sorted(found.items()):
                session.add(AdoptedKey(key_id=key_id, spki_sha256=digest, adopted_at=now))
            deployment.adopted_at = now
            session.add(deployment)
            session.flush()
            record(session, actor=Actor.system("init"), action="deployment.adopt", object_type="deployment",
                   object_id=deployment.deployment_id,
                   summary={"adopted": found, "refused": refused,
                            "rule": "the unmarked keys (by public key SHA-256) this deployment, whose keys predate "
                            "markers, uses; it never uses any other unmarked key"}, at=now)
    except IntegrityError:  # a replica starting at once recorded them first: theirs stand
        return None
    if refused:
        _log.warning("%r: unmarked key(s) not adopted, never used, as their public key is not the one this database "
                     "holds for them (planted, or another's): %s", keystore,
                     "; ".join(f"{k}: {why}" for k, why in sorted(refused.items())))
    unadopted = sorted(k for k, owner in keystore.key_owners().items() if owner is None and k not in found)
    _log.info("%r: this deployment (keys made before markers) adopted %d unmarked key(s), the only unmarked keys it "
              "uses from now on: %s; unmarked, not adopted (never used): %s", keystore, len(found),
              ", ".join(found) or "none", ", ".join(unadopted) or "none")
    return found


def unlike_database(session: Session, keystore: KeyStore, found: dict[str, str]) -> dict[str, str]:
    """Of the keys about to be adopted, those the database can tell are not this deployment's, each with why: a CA
    key id (of a CA row in any state: a retired generation's too) whose certificate's (or JWT) public key is another,
    an audit key that does not verify the latest stored checkpoint, and a pair whose private object does not sign
    under its public one (the public object alone is what the hash pins). Why: the token may hold, under a label this
    deployment names, a key planted after its own was deleted (a retired generation's, an audit key), and adopting it
    would have it used (the audit key signs checkpoints) and `ca keys` call it adopted. The API issuer key has nothing
    in the database to compare with (a token stores only its id): adopted as found."""
    expected: dict[str, str] = {}
    for ca in session.exec(select(CertificateAuthority)).all():
        expected[ca.key_id] = spki_sha256(certificate(ca).public_key())  # type: ignore[arg-type]
        if ca.jwt_key_id is not None and ca.jwt_public_pem is not None:
            expected[ca.jwt_key_id] = spki_sha256(
                serialization.load_pem_public_key(ca.jwt_public_pem.encode()))  # type: ignore[arg-type]
    refused = {k: "not the public key of the certificate its CA row names" for k, d in found.items()
               if k in expected and expected[k] != d}
    for key_id in sorted(set(found) - set(refused)):  # a pair whose private object was swapped (CKA_ID copied)
        try:
            keystore.get(key_id).sign(b"trustfabric adoption: does the private object sign under the public one")
        except KeyStoreError:  # (keys/pkcs11.py Pkcs11Signer verifies each signature under the public object)
            refused[key_id] = "its private object does not sign under its public one (replaced, or planted)"
    checkpoint = latest_checkpoint(session)
    if AUDIT_KEY_ID in found and checkpoint is not None:
        try:
            verify_checkpoint(checkpoint.note, ed25519_public_key(audit_signer(keystore)))
        except (CheckpointError, KeyStoreError, TypeError, ValueError):
            refused[AUDIT_KEY_ID] = f"does not verify the stored checkpoint of tree size {checkpoint.size}"
    return refused


def missing_adopted(ctx: AppContext) -> list[Adoption]:
    """The adopted keys of the labels this deployment signs with (the key ids of its CA generations in use, the audit
    and API issuer keys) that it no longer finds: missing from the token, or another unmarked key in their place
    (never used), and no marked key of its own made since under that label. [] for another key store."""
    keystore = ctx.keystore
    if not isinstance(keystore, MarkedKeyStore):
        return []
    with ctx.db.read_session() as session:
        adoptions = read_adoptions(session.connection())
        signs_with = {*key_ids_in_use(session), *FIXED}
        row = read_deployment(session.connection())
    adoptions = {k: a for k, a in adoptions.items() if k in signs_with}
    if not adoptions or row is None:
        return []
    owners = keystore.key_owners()
    in_use = keystore.unmarked_in_use()
    return [a for k, a in sorted(adoptions.items()) if k not in in_use and owners.get(k) != row.deployment_id]


def unadopted_in_use(ctx: AppContext) -> list[str]:
    """The key ids of CA generations in use whose key in the token is unmarked and was not adopted by this (upgraded,
    adopted) deployment (unlike_database refused it): never used, so the start refuses naming them. [] otherwise."""
    keystore = ctx.keystore
    if not isinstance(keystore, MarkedKeyStore):
        return []
    with ctx.db.read_session() as session:
        row = read_deployment(session.connection())
        adoptions = read_adoptions(session.connection())
        in_use = key_ids_in_use(session)
    if row is None or not row.adopted:
        return []
    owners = keystore.key_owners()
    return sorted(k for k in in_use if k in owners and owners[k] is None and k not in adoptions)


def describe_missing(gone: list[Adoption]) -> str:
    """One line naming adopted keys missing_adopted found."""
    return ("key(s) this deployment adopted (made before markers) are missing from the token, or another key without "
            "a marker is in their place, which it never uses: " + "; ".join(
                f"{a.key_id} (adopted at {a.adopted_at.isoformat()}, public key SHA-256 {a.spki_sha256})"
                for a in gone))


def _say_missing(ctx: AppContext) -> None:
    gone = missing_adopted(ctx)
    if gone:
        _log.warning("%r: %s; a CA key of a generation in use cannot sign until it is restored, and the audit and API "
                     "issuer keys are made anew, marked", ctx.keystore, describe_missing(gone))
