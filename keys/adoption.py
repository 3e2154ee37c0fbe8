"""The unmarked keys an upgraded deployment adopts: what it may use of a PKCS#11 token's keys without a marker.

Why: a deployment whose keys predate markers (origin `upgrade`, keys/deployment.py) used an unmarked key of a label
whenever it had no marked key of that label, for ever and for any label, including labels it first looked up later.
So whoever could write an unmarked object into the token (a planted `api-issuer` after the one it had was deleted, a
CA key id a rotation was about to make, another `audit-checkpoint` swapped in) could have it sign with their key.

So its first start on this version (workflows/adoption.py, and every later start until that is done) records, in one
transaction with a `deployment.adopt` audit event, each unmarked key it uses: for each label it uses (the key ids its
CA rows name, audit-checkpoint, api-issuer) of which it has no marked key and the token holds one unmarked private
key, the label and the SHA-256 of that key's public SubjectPublicKeyInfo DER (its pair's public object), and the time
in `deployment.adopted_at`. From then on a lookup takes an unmarked key only when its public key is the one adopted
under its label: any other unmarked key, of an adopted label or of any other, is never used (KeyNotFound naming it, as
for a deployment made with markers), and a start then makes a marked key of its own where it makes one (audit and API
issuer keys). The objects are never re-marked (C_SetAttributeValue): two pre-marker deployments may share one unmarked
key (same token, fixed label), and re-marking it for one would take it from the other; each records it as adopted.

An adopted key gone from the token (or replaced by another unmarked key) stays fail-closed: a lookup raises
KeyNotFound saying when it was adopted and that it is missing; a CA key it named can no longer sign (the start refuses,
as for any missing CA key), and the audit and API issuer keys are made anew, marked, with a warning line at each start
naming the adoption. A label with several unmarked private keys at adoption time cannot be told apart: the start
refuses, writing nothing, until an operator removes the one that is not this deployment's.

Replicas starting at once take turns on the deployment row's lock; the adopted rows' primary key makes them written
once, and the loser reads the winner's. The schema step (19) adopts nothing: a migration cannot reach the token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from cryptography.hazmat.primitives import serialization
from sqlalchemy import Connection, Table, select

from core.clock import as_utc
from keys.models import AdoptedKey
from keys.store import PublicKey

TABLE: Table = AdoptedKey.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Adoption:
    key_id: str
    spki_sha256: str  # hex SHA-256 of the adopted public key's SubjectPublicKeyInfo DER
    adopted_at: datetime


def spki_sha256(public: PublicKey) -> str:
    """The hex SHA-256 of a public key's SubjectPublicKeyInfo DER: what identifies an adopted key."""
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def read_adoptions(conn: Connection) -> dict[str, Adoption]:
    """The keys this database adopted, by key id (label); empty before its adoption or for a deployment made with
    markers."""
    rows = conn.execute(select(TABLE.c.key_id, TABLE.c.spki_sha256, TABLE.c.adopted_at)).all()
    return {str(k): Adoption(str(k), str(d), as_utc(at)) for k, d, at in rows}
