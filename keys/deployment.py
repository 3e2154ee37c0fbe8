"""The deployment id: which deployment made a key, for a key store several deployments may share (a PKCS#11 token).

Why: every start removes the CA keys that no CA generation uses (workflows/init.py), such as the keys of a rotation
killed (kill -9, power loss) between making them and committing the CA rows that name them. In a file key store every
key is provably the database's own. A token, though, may be shared by several deployments (trust domains, databases):
a key there that this database has no row for might be another deployment's live CA key. So keys/pkcs11.py marks
every key pair it generates with the deployment that made it, and a start destroys only unused keys marked with its
own id. A key with another deployment's marker, or with none (made before markers existed, or by other software), is
never touched.

The id: 128 random bits as 32 lowercase hex digits, in the one row of the `deployment` table. `init` writes it once
(workflows/init.py ensure_deployment), with an audit event, in a transaction of its own before it makes any key, so
that keys an init killed midway made carry the id the next start reads. Replicas on one database share it (one
database, one deployment). A copy of the database (a restored backup run beside the original) is the same deployment
to a token: give a copy a token of its own. A database without the row (before init ran on this version) makes
unmarked keys, which are never removed automatically.

The marker is CKA_ID, the attribute PKCS#11 defines for telling key pairs apart. Both objects of a pair get it:
`trustfabric/<deployment id>/<key id>` in ASCII. It is unique per pair, as CKA_ID is meant to be, so an `id=` in a
PKCS#11 URI names one pair, and it says whose the pair is.

The token is also the second witness of a CA key's commit (keys/intents.py): once the transaction committing the CA
rows that name a key has committed, the key's marker becomes `trustfabric/<deployment id>/<key id>/committed`
(C_SetAttributeValue on CKA_ID, which PKCS#11 lets an application change; private object first, then public). A
database backup is restored without its token, so a start on a copy whose intents name a key the token says was
committed knows a later state of this deployment committed it, and never destroys it. Versions before this one read a
committed marker as no marker: they use such a key (its label is its own) and never destroy it.

Origin: a deployment whose database held a trust domain before it had a deployment id (its keys were made before
markers existed: `upgrade`) uses unmarked keys; a deployment init made with markers from birth (`init`) never does: an
unmarked `audit-checkpoint` (or API issuer, or CA) key in the token is someone else's, planted or left, and signing
with it would let whoever holds it sign for us. Recorded once, with the id (workflows/init.py ensure_deployment;
schema step 18 for rows written before it). An upgraded deployment uses only the unmarked keys it adopted: its first
start on schema step 19's version records, for each label it uses, the one unmarked key it then used (its public key's
SHA-256, in `adopted_keys`, and the time in `deployment.adopted_at`; keys/adoption.py). Until that start it uses any
unmarked key of a label it has no marked key of, as before; from then on only an adopted one whose public key is the
one recorded, never an unmarked key planted or swapped in later. The unmarked objects are never re-marked: two
pre-marker deployments may share one (same token, fixed label), and each adopts it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Table, select

from core.clock import as_utc
from keys.models import Deployment

TABLE: Table = Deployment.__table__  # type: ignore[attr-defined]
DEPLOYMENT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_MARKER_RE = re.compile(rb"^trustfabric/([0-9a-f]{32})/([^/]+)(/committed)?$")
_COMMITTED = b"/committed"
ORIGIN_INIT = "init"  # made by init on a database without a trust domain: every key of it marked from birth
ORIGIN_UPGRADE = "upgrade"  # a database that held a trust domain (unmarked keys) before it had a deployment id


@dataclass(frozen=True)
class DeploymentRow:
    deployment_id: str
    origin: str | None  # ORIGIN_INIT, ORIGIN_UPGRADE; None only for a row written by hand (never adopts)
    adopted_at: datetime | None = None  # when an upgraded deployment recorded the unmarked keys it adopts

    @property
    def adopts_any_unmarked(self) -> bool:
        """Whether a lookup may take any unmarked key of a label this deployment has no marked key of: only a
        deployment whose keys predate markers, and only until its first start on this version recorded which unmarked
        keys it uses (keys/adoption.py)."""
        return self.origin == ORIGIN_UPGRADE and self.adopted_at is None

    @property
    def adopted(self) -> bool:
        """Whether this deployment recorded the unmarked keys it adopts: it uses those, and no other unmarked key."""
        return self.origin == ORIGIN_UPGRADE and self.adopted_at is not None


def read_deployment(conn: Connection) -> DeploymentRow | None:
    """This database's deployment row, or None before init wrote it."""
    row = conn.execute(select(TABLE.c.deployment_id, TABLE.c.origin, TABLE.c.adopted_at).where(TABLE.c.id == 1)).first()
    if row is None:
        return None
    origin, adopted_at = row[1], row[2]
    return DeploymentRow(str(row[0]), None if origin is None else str(origin),
                         None if adopted_at is None else as_utc(adopted_at))


def read_deployment_id(conn: Connection) -> str | None:
    """This database's deployment id, or None before init wrote it."""
    found = read_deployment(conn)
    return None if found is None else found.deployment_id


def marker(deployment_id: str, key_id: str) -> bytes:
    """The CKA_ID of the key pair `key_id` that deployment `deployment_id` generates."""
    if not DEPLOYMENT_ID_RE.fullmatch(deployment_id):
        raise ValueError(f"a deployment id is 32 lowercase hex digits, not {deployment_id!r:.80}")
    return f"trustfabric/{deployment_id}/{key_id}".encode("ascii")


def committed_marker(deployment_id: str, key_id: str) -> bytes:
    """The CKA_ID of that key pair once a committed CA row of its deployment names it (the token's witness)."""
    return marker(deployment_id, key_id) + _COMMITTED


def marker_owner(cka_id: bytes, key_id: str) -> str | None:
    """The deployment id a key's CKA_ID names (committed or not), or None when there is no marker: an empty or foreign
    CKA_ID, or a marker made for another key id (copied or relabelled objects are nobody's)."""
    found = _MARKER_RE.fullmatch(bytes(cka_id))
    if found is None or found.group(2) != key_id.encode("ascii", "replace"):
        return None
    return found.group(1).decode("ascii")


def marked_committed(cka_id: bytes, key_id: str) -> bool:
    """Whether a key's CKA_ID is a marker that says a committed CA row named the key (committed_marker)."""
    found = _MARKER_RE.fullmatch(bytes(cka_id))
    return found is not None and found.group(2) == key_id.encode("ascii", "replace") and found.group(3) is not None


def pair_marker(cka_id: bytes) -> bytes:
    """A CKA_ID without its committed mark: what both objects of one pair share while the mark is set on one of them
    and not yet on the other (a process stopped in between)."""
    cka_id = bytes(cka_id)
    if _MARKER_RE.fullmatch(cka_id) is not None and cka_id.endswith(_COMMITTED):
        return cka_id[: -len(_COMMITTED)]
    return cka_id
