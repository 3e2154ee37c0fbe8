"""Key intents: the keys this database recorded it was about to make in a PKCS#11 token, committed before they are made.

Why: a start destroys the CA keys of this deployment that no CA row names (workflows/init.py), the keys of a rotation
killed between making them and committing the CA rows that name them. The marker (keys/deployment.py) proves a key is
this deployment's, not that this database's state is the latest one: a database restored from a backup has no CA
row for the keys of the generations committed after that backup, and destroying those (irreversible in a token) makes
every later backup, or a point-in-time recovery, unable to start. So a rotation (or init) first commits a row per key
id it will make, in a transaction of its own, and only then begins its own transaction and makes the keys; the
transaction that commits the CA rows naming them deletes those rows. A start destroys an unused marked key only when
a row here names it; a key without one was made after this database's state (a restored backup) and is left. And
only when the token does not say the key was committed (keys/deployment.py): a backup taken between the intents'
commit and the rotation's holds the intents and no CA row, yet the rotation committed; the token, never restored with
a database, is marked once the CA rows naming the key have committed, and such a key is left too. And only once the
row is ABANDONED_AFTER old: a copy started while the live rotation is between making the key and its commit sees the
same as after a kill; the live rotation commits within COMMIT_WITHIN of its rows (else rolls back) and is marked by
then, by itself or by another replica's background job.

Bookkeeping, not a change an auditor judges: a row grants nothing, makes no key and names no trust (the `key_blobs`
rows of keys/shared.py are written without an event too). What a row enables, destroying a key, commits with its
`ca.key.destroy` event, which names the intent's time.

The file key store keeps its own rule: it never needs one. Its keys' ciphertext is in the database (`key_blobs`),
committed in the transaction that commits the CA rows naming them, so any backup that names a key holds the key: a
file a restored database removes comes back from a later backup's row (keys/shared.py `get`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import Connection, Table, delete, insert, select

from keys.models import KeyIntent
from store.db import Database

TABLE: Table = KeyIntent.__table__  # type: ignore[attr-defined]

# An intent whose key was never made (the rotation failed first, or found the generation made by another replica) is
# removed by the start's sweep once this old: a rotation that wrote its intent and waits for the lock is not robbed.
# And a start destroys an unused, never committed key an intent names only once the intent is this old: a copy of the
# database (a staging copy, a restored backup) started against the token while the live rotation is between making
# its keys and its commit holds the intents and sees no CA row nor committed mark; the live rotation commits well
# within COMMIT_WITHIN of its intents (else it rolls back: workflows/rotation.py), and marks them right after.
ABANDONED_AFTER = timedelta(minutes=10)
COMMIT_WITHIN = ABANDONED_AFTER / 2  # the margin: clock skew between hosts, the COMMIT itself, the mark after it


def record_intents(db: Database, key_ids: Iterable[str], deployment_id: str, now: datetime) -> None:
    """Commit, in a transaction of its own, that this database is about to make `key_ids` (marked for
    `deployment_id`). Called before the transaction that makes the keys begins: a write transaction this thread has
    open is an error (on SQLite its writer lock would make this wait for itself; and a row written in it would vanish
    with the process it is meant to outlive)."""
    if db.open_session() is not None:
        raise RuntimeError("key intents are committed before the transaction that makes the keys, not inside it")
    rows = [{"key_id": k, "deployment_id": deployment_id, "created_at": now} for k in key_ids]
    if rows:
        with db.engine.begin() as conn:
            conn.execute(insert(TABLE), rows)


def intents(conn: Connection, deployment_id: str) -> dict[str, datetime]:
    """Every key id recorded as about to be made for `deployment_id`, with when."""
    stmt = select(TABLE.c.key_id, TABLE.c.created_at).where(TABLE.c.deployment_id == deployment_id)
    return {str(key_id): created_at for key_id, created_at in conn.execute(stmt)}


def forget(conn: Connection, key_ids: Iterable[str]) -> int:
    """Delete the intents of `key_ids` (in `conn`'s transaction); how many there were."""
    ids = sorted(set(key_ids))
    if not ids:
        return 0
    return int(conn.execute(delete(TABLE).where(TABLE.c.key_id.in_(ids))).rowcount or 0)


def forget_unmade(db: Database, key_ids: Iterable[str], made: Iterable[str]) -> None:
    """After a rotation that failed or made no keys: delete, in a transaction of its own, the intents of `key_ids`
    whose key is not in `made` (the key store holds no such key); an intent whose key is held stays, for the next
    start to destroy the key (a rollback whose destroy failed)."""
    gone = set(key_ids) - set(made)
    if gone:
        with db.engine.begin() as conn:
            forget(conn, gone)
