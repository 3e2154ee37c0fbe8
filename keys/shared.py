"""File keys shared by the replicas of one trust domain through its database (issue 11).

Every replica has a data directory, and so a keys/ directory, of its own; a key one of them generates (a CA
rotation's, at half of the CA's life, on whichever replica runs the job) must sign on all of them. This store is a
FileKeyStore whose generated keys are also published to the `key_blobs` table, and whose missing keys are fetched
from there. A row is exactly the bytes of the key file: AES-256-GCM ciphertext under the master key with the key id
and kind as associated data. The database and its backups never hold a private byte in clear, and only a holder of
the master key can use a row, or make one another replica accepts (GCM authenticates it).

- generate: the file, then its row. Inside this thread's open write transaction on the database (Database.session:
  a CA rotation's, or init's), the row joins that transaction, in a savepoint: it commits with the CA row that names
  the key, or rolls back with it, and then the file goes too (keys/undo.py, the rule a PKCS#11 token's keys follow
  too; a rotation that fails after making its keys, a deadlock, a lost connection, leaves no key that no CA
  generation uses: neither a row every replica could fetch nor a file here). On PostgreSQL the row used to commit
  in a transaction of its own before generate returned, and so stayed behind whenever the rotation rolled back.
  Outside such a transaction (the audit and API-issuer keys) the row commits in a transaction of its own before
  generate returns. A publish that fails removes the file: no key lives on one replica only.
- get / exists of a key without a file: its row must decrypt under this store's master key (else WrongMasterKey,
  nothing written), then it is written as the file (0600, tmp + link) and served. A file here always wins; a row
  never overwrites a file with other bytes (KeyExists).
- delete: the row (in the open write transaction when there is one, as generate's) and the file.
- discarding keys no CA generation uses, left before this by rotations that rolled back (or by a process killed
  mid-rotation, which leaves its file here): workflows/init.py, which init and serve run, under the trust domain's
  settings lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, Table, delete, insert, select
from sqlalchemy.exc import IntegrityError

from keys.errors import KeyExists, KeyNotFound
from keys.file import FileKeyStore
from keys.models import KeyBlob
from keys.store import KeyKind, Signer, check_key_id
from keys.undo import discard_on_rollback
from store.db import Database

_TABLE: Table = KeyBlob.__table__  # type: ignore[attr-defined]
_SOURCE = "the database's shared keys (key_blobs)"


class SharedKeyStore:
    """A FileKeyStore whose keys every replica on the same database and master key can use."""

    def __init__(self, files: FileKeyStore, db: Database) -> None:
        self.files = files
        self._db = db

    def __repr__(self) -> str:
        return f"SharedKeyStore({self.files!r})"

    def generate(self, key_id: str, kind: KeyKind) -> Signer:
        """Create a key; an existing key_id (here or published by any replica) is KeyExists, never overwritten."""
        kind = KeyKind(kind)
        check_key_id(key_id)
        if self._published(key_id) is not None:
            raise KeyExists(f"key {key_id!r} exists already (published in {_SOURCE}); keys are never overwritten")
        signer = self.files.generate(key_id, kind)
        try:
            self._publish(key_id, kind, self.files.blob(key_id), generated=True)
        except BaseException:
            with contextlib.suppress(KeyNotFound):
                self.files.delete(key_id)
            raise
        return signer

    def get(self, key_id: str) -> Signer:
        """The key, or KeyNotFound."""
        try:
            return self.files.get(key_id)
        except KeyNotFound:
            blob = self._published(key_id)
            if blob is None:
                raise KeyNotFound(
                    f"no key {key_id!r} in the key store at {self.files.directory} nor in {_SOURCE}") from None
        return self.files.adopt(key_id, blob, source=_SOURCE)

    def exists(self, key_id: str) -> bool:
        """Whether a key with this id is held (fetched first when only published)."""
        if self.files.exists(key_id):
            return True
        blob = self._published(key_id)
        if blob is None:
            return False
        self.files.adopt(key_id, blob, source=_SOURCE)
        return True

    def delete(self, key_id: str) -> None:
        """Destroy the key, for every replica; KeyNotFound when there is none."""
        rows = self.unpublish(key_id)
        try:
            self.files.delete(key_id)
        except KeyNotFound:
            if not rows:
                raise

    def unpublish(self, key_id: str) -> bool:
        """Remove the key's row (in this thread's open write transaction when there is one), not its file here;
        whether there was one. Other replicas keep a file they fetched: for a key none of them ever fetched."""
        check_key_id(key_id)
        return bool(self._write(lambda conn: conn.execute(delete(_TABLE).where(_TABLE.c.key_id == key_id)).rowcount))

    def published_ids(self) -> list[str]:
        """The ids of every key in the table, sorted."""
        with self._db.statement() as conn:
            return sorted(str(row[0]) for row in conn.execute(select(_TABLE.c.key_id)))

    def publish_held(self, key_ids: list[str]) -> list[str]:
        """Publish those of `key_ids` this store holds as files and the table does not: keys made before they were
        shared (an upgraded install's first CA generation, audit and API-issuer keys). The ids published."""
        published = []
        for key_id in key_ids:
            if not self.files.exists(key_id):
                continue
            row = self._published(key_id)
            blob = self.files.blob(key_id)
            if row is None:
                try:
                    self._publish(key_id, self.files.get(key_id).kind, blob)
                except KeyExists:  # published meanwhile by another replica starting up: compared below
                    row = self._published(key_id)
                else:
                    published.append(key_id)
                    continue
            if row is not None and row != blob:
                raise KeyExists(f"key {key_id!r} in {_SOURCE} differs from the key file in {self.files.directory}; "
                                "keys are never overwritten")
        return published

    def _published(self, key_id: str) -> bytes | None:
        with self._db.statement() as conn:
            row = conn.execute(select(_TABLE.c.blob).where(_TABLE.c.key_id == check_key_id(key_id))).first()
        return None if row is None else bytes(row[0])

    def _publish(self, key_id: str, kind: KeyKind, blob: bytes, *, generated: bool = False) -> None:
        values = {"key_id": key_id, "kind": kind.value, "blob": blob, "created_at": datetime.now(UTC)}
        try:
            self._write(lambda conn: conn.execute(insert(_TABLE).values(**values)).rowcount,
                        generated=key_id if generated else None)
        except IntegrityError:  # another replica published this id between our check and now
            raise KeyExists(f"key {key_id!r} was published meanwhile by another replica; keys are never "
                            "overwritten") from None

    def _write(self, statement: Callable[[Connection], int], *, generated: str | None = None) -> int:
        """Run `statement` in this thread's open write transaction on the database when there is one, in a savepoint
        (an IntegrityError leaves that transaction usable), so that it commits or rolls back with it; the file of
        a key `generated` there is removed if it rolls back (keys/undo.py). Else in a transaction of its own,
        committed on return.
        (On SQLite a transaction of its own would wait for this thread's writer lock until busy_timeout; there the
        lock is ours, so the check before an insert is exact.)"""
        joined = self._db.open_session()
        if joined is None:
            with self._db.engine.begin() as conn:
                return statement(conn)
        with joined.begin_nested():
            done = statement(joined.connection())
        if generated is not None:
            discard_on_rollback(self._db, generated, self.files)
        return done
