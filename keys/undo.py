"""A key generated inside a database write transaction goes if that transaction rolls back, and stays once it
commits: the one rule for every key store that sits beside a database (keys/shared.py's key files, keys/pkcs11.py's
token objects). A CA rotation makes its keys before it writes the CA rows that name them; if the rotation fails or is
rolled back afterwards, nothing will ever name those keys, and a key nothing uses is a private key kept for nothing
(in an HSM, an orphan object for ever). The store's `delete` removes it; a delete that fails is logged, key id and
store only, never raised: the rollback under way must finish.

A PKCS#11 token's keys (`irreversible`), though, not when the rollback follows a COMMIT that was sent and failed: its
outcome is unknown to the client (on PostgreSQL the server may have committed and the answer been lost with the
connection: a failover, a pooler restart, a network cut), and the CA rows naming the keys may be in the database.
Destroying them then left a committed CA generation without its keys, and every later start failing. They are kept
and logged; the next start decides with the database's own word (workflows/init.py: the token's keys no CA row names
are destroyed when their intent says this database was about to make them, and the token does not say they were
committed: a committed COMMIT's keys are named by its CA rows, so that start marks them committed instead). The shared
file store's key file goes as before: its ciphertext row (keys/shared.py) commits with the CA rows, and a missing file
comes back from it."""

from __future__ import annotations

import logging
from typing import Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from keys.errors import KeyNotFound
from store.db import Database

_UNDONE = "tf_generated_keys"  # Session.info: the keys generated in the session's open transaction (_Undo)
_log = logging.getLogger(__name__)


class Deletable(Protocol):
    """Where a generated key lives: what undoes it."""

    def delete(self, key_id: str) -> None:
        """Destroy the key; KeyNotFound when there is none."""
        ...


def discard_on_rollback(db: Database, key_id: str, store: Deletable, *, irreversible: bool = False) -> None:
    """`store`'s key `key_id`, just generated: when this thread has a write transaction open on `db`
    (Database.session), deleted from `store` if that transaction (its innermost open savepoint, or anything enclosing
    it) rolls back, or ends without a commit; kept once the outermost commits. Outside one, nothing: the key is kept
    (the audit and API-issuer keys, made outside any transaction). `irreversible` (nothing could bring the key back
    once deleted): kept, too, when the transaction ends after its COMMIT failed (committed or not: unknown)."""
    session = db.open_session()
    if session is not None:
        _Undo.of(session).add(session, key_id, store, irreversible)


class _Undo:
    """The keys generated in a session's open transaction, each with the (innermost) transaction open when it was
    made: removed when that transaction, or one enclosing it, rolls back (or the session's transaction ends without
    a commit); kept once the outermost commits. Listeners on that session alone, added by its first generated key:
    the sessions of every other transaction pay nothing."""

    def __init__(self) -> None:
        self.keys: list[tuple[SessionTransaction, str, Deletable, bool]] = []
        self.committing = False  # the outermost transaction's COMMIT was sent: a failure now has an unknown outcome

    @classmethod
    def of(cls, session: Session) -> _Undo:
        undo = session.info.get(_UNDONE)
        if not isinstance(undo, _Undo):
            undo = session.info[_UNDONE] = cls()
            event.listen(session, "after_commit", undo._committed)
            event.listen(session, "after_soft_rollback", undo._rolled_back)
            event.listen(session, "after_transaction_end", undo._ended)
        return undo

    def add(self, session: Session, key_id: str, store: Deletable, irreversible: bool) -> None:
        # a session that has run nothing yet has no transaction (autobegin): begun here, so that the key goes with it
        transaction = session.get_nested_transaction() or session.get_transaction() or session.begin()
        self.keys.append((transaction, key_id, store, irreversible))
        conn = session.connection()  # the connection whose COMMIT (not a savepoint's release) decides
        if not event.contains(conn, "commit", self._committing):
            event.listen(conn, "commit", self._committing)

    def _committing(self, _conn: object) -> None:
        self.committing = True

    def _committed(self, session: Session) -> None:
        if not session.in_nested_transaction():  # the outermost (after_commit fires for a savepoint's release too)
            self.keys.clear()
            self.committing = False

    def _rolled_back(self, _session: Session, previous: SessionTransaction) -> None:
        self._remove([k for k in self.keys if _within(k[0], previous)])

    def _ended(self, _session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # what a commit did not keep: ended without one (closed)
            self._remove(list(self.keys))
            self.committing = False

    def _remove(self, undone: list[tuple[SessionTransaction, str, Deletable, bool]]) -> None:
        for entry in undone:
            self.keys.remove(entry)
            _transaction, key_id, store, irreversible = entry
            if irreversible and self.committing:  # the COMMIT failed: perhaps carried out (module doc)
                _log.warning("key %s, made in a transaction whose COMMIT failed (committed or not: unknown), is kept "
                             "in %r; a start destroys it if no CA row names it and an intent does", key_id, store)
                continue
            try:
                store.delete(key_id)
            except KeyNotFound:
                pass
            except Exception as exc:  # a rollback under way must not fail for this: said, not raised
                _log.warning("key %s, made in a transaction that rolled back, is left in %r: %s: %s", key_id, store,
                             type(exc).__name__, exc)


def _within(transaction: SessionTransaction | None, outer: SessionTransaction) -> bool:
    """Whether `transaction` is `outer` or nested in it."""
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False
