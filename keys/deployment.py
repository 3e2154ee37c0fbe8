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
"""

from __future__ import annotations

import re

from sqlalchemy import Connection, Table, select

from keys.models import Deployment

TABLE: Table = Deployment.__table__  # type: ignore[attr-defined]
DEPLOYMENT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_MARKER_RE = re.compile(rb"^trustfabric/([0-9a-f]{32})/(.+)$", re.DOTALL)


def read_deployment_id(conn: Connection) -> str | None:
    """This database's deployment id, or None before init wrote it."""
    row = conn.execute(select(TABLE.c.deployment_id).where(TABLE.c.id == 1)).first()
    return None if row is None else str(row[0])


def marker(deployment_id: str, key_id: str) -> bytes:
    """The CKA_ID of the key pair `key_id` that deployment `deployment_id` generates."""
    if not DEPLOYMENT_ID_RE.fullmatch(deployment_id):
        raise ValueError(f"a deployment id is 32 lowercase hex digits, not {deployment_id!r:.80}")
    return f"trustfabric/{deployment_id}/{key_id}".encode("ascii")


def marker_owner(cka_id: bytes, key_id: str) -> str | None:
    """The deployment id a key's CKA_ID names, or None when there is no marker: an empty or foreign CKA_ID, or a marker
    made for another key id (copied or relabelled objects are nobody's)."""
    found = _MARKER_RE.fullmatch(bytes(cka_id))
    if found is None or found.group(2) != key_id.encode("ascii", "replace"):
        return None
    return found.group(1).decode("ascii")
