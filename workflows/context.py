"""The composition root the API, the PDP and the CLI share at run time: settings, database, key store,
clock. Opening a context opens the database and runs the schema migrations; nothing here speaks HTTP."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine
from sqlmodel import Session

from audit.service import lock_head
from core.clock import Clock, system_clock
from core.errors import InvalidInput
from policy.engines import PolicyEngine, ServingRole, make_engine
from store.db import Database
from store.groupcommit import GroupCommitter
from workflows.schema import migrate
from workflows.settings import Settings

if TYPE_CHECKING:
    from keys.file import FileKeyStore
    from keys.pkcs11 import Pkcs11KeyStore
    from keys.store import KeyStore


def _token(settings: Settings, what: str, db: Database | None = None) -> Pkcs11KeyStore:
    from keys.pkcs11 import Pkcs11KeyStore

    if not (settings.pkcs11_module and settings.pkcs11_token and settings.pkcs11_pin):
        raise InvalidInput(
            f"{what} needs TRUSTFABRIC_PKCS11_MODULE, TRUSTFABRIC_PKCS11_TOKEN and TRUSTFABRIC_PKCS11_PIN"
        )
    return Pkcs11KeyStore(settings.pkcs11_module, settings.pkcs11_token, settings.pkcs11_pin, db=db)


def _passphrase(settings: Settings) -> str | None:
    if settings.passphrase_file is not None:
        try:
            return settings.passphrase_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise InvalidInput(f"cannot read TRUSTFABRIC_PASSPHRASE_FILE {settings.passphrase_file}: {exc}") from None
    return settings.passphrase


def open_keystore(settings: Settings, *, create: bool, db: Database | None = None) -> KeyStore:
    """The configured KeyStore; with create=True a missing key file is made (mode 0600). The file store's
    master key comes from a key file (default, beside the keys), a passphrase (TRUSTFABRIC_PASSPHRASE or
    _PASSPHRASE_FILE, through scrypt) or a PKCS#11 token (TRUSTFABRIC_MASTER_KEY=pkcs11: wrapped under an
    AES key that never leaves the token). With `db`, the file store shares its keys, encrypted, with every replica
    on that database (keys/shared.py: a key one replica's CA rotation makes signs on all); a PKCS#11 store is one
    token the replicas share already. With `db` either store destroys a key made in a write transaction on it that
    rolls back (keys/undo.py)."""
    files = _file_keystore(settings, create=create)
    if files is None:
        return _token(settings, "the pkcs11 key store", db)
    if db is None:
        return files
    from keys.shared import SharedKeyStore

    return SharedKeyStore(files, db)


def _file_keystore(settings: Settings, *, create: bool) -> FileKeyStore | None:
    """The file key store of open_keystore, or None for the pkcs11 key store."""
    if settings.keystore == "pkcs11":
        return None
    if settings.keystore != "file":
        raise InvalidInput(f"unknown key store {settings.keystore!r} (use file or pkcs11)")
    if settings.master_key not in ("file", "pkcs11"):
        raise InvalidInput(f"unknown master key source {settings.master_key!r} (use file or pkcs11)")
    from keys.file import FileKeyStore

    settings.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if settings.master_key == "pkcs11":
        token = _token(settings, "TRUSTFABRIC_MASTER_KEY=pkcs11")
        try:
            master = token.unwrap_master(settings.keys_dir / "master.wrapped")
        finally:
            token.close()
        return FileKeyStore.open(settings.keys_dir, master_key=master)
    passphrase = _passphrase(settings)
    if passphrase:
        return FileKeyStore.open(settings.keys_dir, passphrase=passphrase)
    key_file = settings.default_key_file
    if create and not key_file.exists():
        FileKeyStore.create_key_file(key_file)
    return FileKeyStore.open(settings.keys_dir, key_file=key_file)


def _initialised(settings: Settings, db: Database) -> bool:
    """Whether the database's trust domain exists already; then a missing master key file is an error, not one
    to make: a new key would not open the keys the trust domain was made with (pki.ca.check_keys)."""
    from pki.service import trust_domain

    with db.read_session() as session:
        found = trust_domain(session)
    if found is None:
        return False
    key_file = settings.default_key_file
    uses_key_file = settings.keystore == "file" and settings.master_key == "file" and not (
        settings.passphrase or settings.passphrase_file)
    if uses_key_file and not key_file.exists():
        raise InvalidInput(
            f"no master key file {key_file}, and trust domain {found} in the database exists already: give this "
            "data directory a copy of the first one's keys/ and master key (or the same passphrase or PKCS#11 token)")
    return True


@dataclass
class AppContext:
    settings: Settings
    db: Database
    keystore: KeyStore
    clock: Clock = field(default=system_clock)

    @classmethod
    def open(cls, settings: Settings, *, create: bool = False, clock: Clock = system_clock) -> AppContext:
        """Open (and with create=True, make) the data directory, database schema and key store."""
        if settings.database_url is None:
            if create:
                settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.chmod(settings.home, 0o700)
            elif not settings.home.exists():
                raise InvalidInput(f"{settings.home} does not exist: run `trustfabric init` first")
        db = Database(settings.db_url)
        try:
            migrate(db.engine)
            # the key store of an initialised database exists: never make a key file for one
            initialised = _initialised(settings, db)
            keystore = open_keystore(settings, create=create and not initialised, db=db)
        except BaseException:
            db.dispose()
            raise
        return cls(settings=settings, db=db, keystore=keystore, clock=clock)

    @property
    def reader(self) -> Engine:
        """The engine for read-only Core queries (on SQLite: a plain BEGIN, never the writer lock)."""
        engine: Engine | None = self.__dict__.get("_reader")
        if engine is None:
            engine = self.db.engine.execution_options(tf_write=False)
            self.__dict__["_reader"] = engine
        return engine

    @property
    def committer(self) -> GroupCommitter:
        """The process's group committer for small writes (store/groupcommit.py), started on first use."""
        found: GroupCommitter | None = self.__dict__.get("_committer")
        if found is None:
            found = self.__dict__.setdefault("_committer", GroupCommitter(self.db, head_lock=lock_head))
        return found

    def engine(self, role: ServingRole) -> PolicyEngine:
        """A new policy engine for `role`, of the kind the settings choose (policy.engines.make_engine)."""
        return make_engine(self.settings.engines(), role)

    def close(self) -> None:
        committer: GroupCommitter | None = self.__dict__.get("_committer")
        if committer is not None:
            committer.close()
        self.db.dispose()


def trust_domain(ctx: AppContext, session: Session) -> str:
    """The trust domain in force: what `init` stored (pki settings), else the configured one."""
    from pki.service import trust_domain as stored

    return stored(session) or ctx.settings.trust_domain
